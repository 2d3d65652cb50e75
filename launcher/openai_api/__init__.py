"""An OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, /v1/models, /health, /metrics) that rank 0
runs beside the KServe gRPC endpoint: translate.py (OpenAI bodies <-> the contract, pure), backend.py (the gRPC
stream to the endpoint), app.py (the routes), chat.py (the model's chat template, without transformers), auth.py (the
API key), process.py (the child process and its handle)."""
