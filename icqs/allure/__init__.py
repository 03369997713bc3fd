"""ALLURE: auditing an evaluator LLM and improving it with iterative in-context learning.

The evaluator labels (task, response) items (evaluator.py, prompts from template.py); the audit checks each label
against the task's correct answer by regular-expression matching (audit.py); disagreements become ICL examples in a
persistent SQLite memory (memory.py), optionally audited by a human; the loop re-runs the evaluator with the grown
memory (loop.py, state in run_dir.py). Failure modes are clustered from sentence embeddings (failure_modes.py) and
ablated (ablation.py); metrics (metrics.py) and plots (plots.py) go into an HTML report (report.py). CLI: cli.py.
"""
