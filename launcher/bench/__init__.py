"""llmlaunch's load generator and report (console scripts `llmlaunch-bench`, `llmlaunch-report`).

Modules: datasets (ShareGPT, CNN/DailyMail, prompts.txt, synthetic), runner
(load shapes, client processes), loads (the closed and open loops that benchmarks
replay on several paths alike, drawn output lengths), metrics (per-request results,
TTFT/ITL/TPOT/E2EL, goodput, tables), progress (stderr bar), cli (`llmlaunch-bench`),
report (`llmlaunch-report`: sweep directories to summary.csv and plots).
Heavy imports (tritonclient, numpy, matplotlib, transformers) are lazy.
"""
