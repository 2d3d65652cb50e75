"""One rank of a job: what each Slurm task (or local rank process) runs.

topology.py    where this rank stands (the launcher's variables) and what its server is told
rendezvous.py  every rank learns every rank's address; leaders reserve their ports
rank.py        `Rank`: start, wait until ready, publish (rank 0), supervise, and the exit status
supervise.py   the fail-fast / lose-a-replica rule and the waits that notice an end
frontend.py    rank 0 with replicas > 1: the front end over every replica leader
main.py        the entry point: `python -m launcher.rank RUN_DIR` (every Slurm task and local rank runs it)

The child services' handles (ChildService, die_with_parent) and the time limit's drain, which the front end, the
OpenAI API and launcher/triton.py share with the rank, are in launcher/procs, below all of them.
"""
