"""gRPC client for any llmlaunch model (the launcher/contract.py interface).

Command line (`python -m launcher.client`):

    # stream one answer to stdout, token by token
    python -m launcher.client --url grpc://localhost:8001 --prompt "I am going to" --max-tokens 64
    # a file of prompts, sent concurrently, answers written in prompt order
    python -m launcher.client --prompts-file prompts.txt --output results.txt --concurrency 8

`--model` defaults to the model the server serves (asked through the
repository index: the only ready model that takes text_input/max_tokens, else
`ensemble`, else the first). Sampling flags map onto contract inputs:
--temperature, --top-p, --top-k, --seed (random_seed), --stop (stop_words,
repeatable), --min-tokens (min_length), --ignore-eos. Server errors are
printed on stderr and the exit status is 1.

Library (used by launcher.bench):

    from launcher.client.request import Generation, build_inputs, build_request
    from launcher.client.stream import TritonStream, generate

    gen = Generation(prompt="Hi", max_tokens=16, temperature=0.7)
    build_inputs(gen)                    # list of tritonclient.grpc.InferInput
    build_request(model, gen, "id-1")    # the ModelInferRequest protobuf itself
    with TritonStream(url) as stream:    # one gRPC bidirectional stream
        rec = stream.submit(build_request(model, gen, "id-1"))
        stream.wait(rec)
    rec.times                            # perf_counter() at every response
    rec.text, rec.input_tokens, rec.output_tokens, rec.finish_reason, rec.error

The package, one module a job:
    connection.py  parse_url, the gRPC channel options, ClientError
    request.py     Generation and its encoding: raw input payloads, InferInputs, the ModelInferRequest
    response.py    StreamRecord and the readers of a response's payloads (text_output, counts)
    stream.py      TritonStream (many requests on one stream), generate, generate_many, stream_text
    control.py     the server's models: list_models, default_model, honoured_parameters, served_tokenizer
    cli.py         the command line (main) and the sampling flags
"""
