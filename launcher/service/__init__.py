"""A service that outlives its jobs (serve.router=host|job): a router (front end, OpenAI API, controller) apart from
the replicas, each replica a Slurm job of its own that registers when it serves, is handed over to a successor before
its time limit, replaced when it fails, and scaled by load. launcher/service/launch.py starts one; controller.py is the
router; policy.py its rules; docs/operations.md, "A service that outlives its jobs"."""
