"""The side jobs beside ``reasonrl train``, one module each with its settings class and its run function.

``evaluate`` (``reasonrl eval``), ``select_prompts`` (``data select``), ``best_of_n`` (``data bon``),
``offline_sample`` (``data sample``), ``prm_label`` (``prm label``), ``reward_model`` (``rm train``),
``contrastive_pretrain`` (``rm pretrain --contrastive``), ``vlm_build`` (``vlm build``) and ``push``
(``reasonrl push``); ``prompt_sampling`` is what the data jobs share.  The command line builds each job's
options from its settings class.  Jobs sit above ``train``: they may use anything below them, and nothing
below imports them.
"""
