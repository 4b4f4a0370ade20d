"""The side jobs beside ``reasonrl train``, one module each with its settings class and its run function.

``evaluate`` (``reasonrl eval``), ``select_prompts`` (``data select``), ``best_of_n`` (``data bon``),
``offline_sample`` (``data sample``), ``prm_label`` (``prm label``), ``reward_model`` (``rm train``),
``contrastive_pretrain`` (``rm pretrain --contrastive``), ``vlm_build`` (``vlm build``) and ``push``
(``reasonrl push``); ``prompt_sampling`` is what the data jobs share.  The command line builds each job's
options from its settings class.  Jobs sit above ``train``: they may use anything below them, and nothing
below imports them.
"""

# Each side command's job: (its settings class, its run function ``run(settings, progress=...)``, which returns the
# summary the command prints), imported when the command runs or prints its help (a job's module imports torch).


def evaluate_job():
    from reasonrl.jobs.evaluate import EvalSettings, run_eval

    return EvalSettings, run_eval


def reward_model_job():
    from reasonrl.jobs.reward_model import RewardModelRun, run_reward_model_training

    return RewardModelRun, run_reward_model_training


def contrastive_pretrain_job():
    from reasonrl.jobs.contrastive_pretrain import ContrastivePretrainRun, run_contrastive_pretraining

    return ContrastivePretrainRun, run_contrastive_pretraining


def vlm_build_job():
    from reasonrl.jobs.vlm_build import VLMBuildRun, run_vlm_build

    return VLMBuildRun, run_vlm_build


def prm_label_job():
    from reasonrl.jobs.prm_label import PRMLabelRun, run_labelling

    return PRMLabelRun, run_labelling


def select_prompts_job():
    from reasonrl.jobs.select_prompts import PromptSelectionRun, run_selection

    return PromptSelectionRun, run_selection


def best_of_n_job():
    from reasonrl.jobs.best_of_n import BestOfNRun, best_of_n_references

    return BestOfNRun, best_of_n_references


def offline_sample_job():
    from reasonrl.jobs.offline_sample import OfflineSampleRun, run_sampling

    return OfflineSampleRun, run_sampling
