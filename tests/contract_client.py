"""A gRPC client of the common request contract for tests: one stream per request, responses as dicts.

`server` is anything with `grpc_url` and `model` (launcher.triton.TritonServer, or a namespace naming a
running llmlaunch endpoint).
"""

from __future__ import annotations

import queue

import numpy as np


def _inputs(prompt, max_tokens, stream, extra):
    import tritonclient.grpc as grpcclient

    kinds = {
        "text_input": "BYTES",
        "max_tokens": "INT32",
        "stream": "BOOL",
        "ignore_eos": "BOOL",
        "min_length": "INT32",
        "temperature": "FP32",
        "top_k": "INT32",
        "top_p": "FP32",
        "random_seed": "UINT64",
        "seed": "UINT64",
        "stop_words": "BYTES",
        "bad_words": "BYTES",
        "end_id": "INT32",
        "repetition_penalty": "FP32",
        "presence_penalty": "FP32",
        "frequency_penalty": "FP32",
        "beam_width": "INT32",
        "continue_ids": "INT32",
        "kv_from": "BYTES",
        "kv_export": "BOOL",
    }
    values = {
        "text_input": np.array([[prompt.encode()]], dtype=object),
        "max_tokens": np.array([[max_tokens]], np.int32),
        "stream": np.array([[stream]], bool),
    }
    for k, v in extra.items():
        if k == "continue_ids":
            values[k] = np.array([list(v)], np.int32)
        elif isinstance(v, str):
            values[k] = np.array([[v.encode()]], dtype=object)
        elif isinstance(v, (list, tuple)):
            values[k] = np.array([[w.encode() for w in v]], dtype=object)
        else:
            values[k] = np.array(
                [[v]], dtype={"INT32": np.int32, "UINT64": np.uint64, "FP32": np.float32, "BOOL": bool}[kinds[k]]
            )
    out = []
    for k, v in values.items():
        t = grpcclient.InferInput(k, list(v.shape), kinds[k])
        t.set_data_from_numpy(v)
        out.append(t)
    return out


class Stream:
    """One gRPC stream to the model; responses arrive in a queue."""

    def __init__(self, server):
        import tritonclient.grpc as grpcclient

        self.q: "queue.Queue" = queue.Queue()
        self.model = server.model
        self.client = grpcclient.InferenceServerClient(server.grpc_url)
        self.client.start_stream(callback=lambda result=None, error=None: self.q.put((result, error)))

    def send(self, prompt, max_tokens, stream=True, parameters=None, **extra):
        self.client.async_stream_infer(
            self.model,
            _inputs(prompt, max_tokens, stream, extra),
            enable_empty_final_response=True,
            parameters=parameters,
        )

    def next(self, timeout=30):
        """(dict of outputs or None, error or None, final?)"""
        result, error = self.q.get(timeout=timeout)
        if error is not None:
            return None, error, True
        final = result.get_response().parameters["triton_final_response"].bool_param
        out = None
        if result.as_numpy("text_output") is not None:
            # (a request with final_counts_only gets text_output alone before its final response)
            out = {o.name: result.as_numpy(o.name).reshape(-1)[0] for o in result.get_response().outputs}
            for k in ("text_output", "finish_reason", "kv_handle"):
                if k in out:
                    out[k] = out[k].decode()
            for k in ("input_tokens", "output_tokens"):
                if k in out:
                    out[k] = int(out[k])
            if "output_ids" in out:
                out["output_ids"] = result.as_numpy("output_ids").reshape(-1).tolist()
        return out, error, final

    def collect(self, timeout=30):
        responses = []
        while True:
            out, error, final = self.next(timeout)
            if error is not None:
                return responses, error
            if out is not None:
                responses.append(out)
            if final:
                return responses, None

    def close(self, cancel=False):
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


def generate(server, prompt, max_tokens, stream=True, parameters=None, **extra):
    s = Stream(server)
    try:
        s.send(prompt, max_tokens, stream, parameters, **extra)
        return s.collect()
    finally:
        s.close()
