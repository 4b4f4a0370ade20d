"""Multi-turn episodes: conversations, environments (shipped, TRL's, OpenEnv servers) and tool calls."""
