"""launcher.python_backend.responders: one rule sizes who sends a served engine's responses (hf stub threads, their nice
value, rank 0's front-end processes) from the device, the CPUs, the replicas and engine.response_processes."""

from launcher.python_backend.responders import GPU_NICE, GPU_THREADS, Responders, responders


def test_an_engine_process_on_a_gpu_gets_four_threads_and_a_lower_priority_response_path():
    assert responders("cuda", 16) == Responders(threads=GPU_THREADS, nice=GPU_NICE, frontend_processes=1)
    assert (GPU_THREADS, GPU_NICE) == (4, 10)


def test_on_cpu_one_thread_and_the_priority_unchanged():
    """The engine needs the CPU's cores itself, and the nice value was measured on GPU hosts only."""
    assert responders("cpu", 16) == Responders(threads=1, nice=0, frontend_processes=1)


def test_an_engine_on_a_stub_thread_has_one_responder_and_keeps_its_priority():
    """engine_process=false: the engine's callbacks queue single outputs for one responder, and lowering the stub
    would lower the engine with it."""
    assert responders("cuda", 16, engine_process=False) == Responders(threads=1, nice=0, frontend_processes=1)


def test_frontend_processes_are_one_per_process_sending_responses():
    """replicas x engine.response_processes, capped at half of rank 0's CPUs (its own server runs there too), never
    below 1; the device does not change it."""
    front = lambda replicas, processes, cpus: responders("cuda", cpus, processes, replicas).frontend_processes  # noqa: E731
    assert front(2, 2, 32) == 4  # two replicas with two stubs each: four
    assert front(2, 1, 32) == 2
    assert front(8, 4, 32) == 16  # half the CPUs
    assert front(2, 1, 2) == 1  # a 2-CPU machine keeps one
    assert front(2, 1, 1) == 1
    assert responders("cpu", 32, 2, 2).frontend_processes == 4
