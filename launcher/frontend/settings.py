"""The front end's settings that come from the launch's serve.* config, in one place for both who start a front end:
rank 0 of a job with replicas (launcher/rank/frontend.py) and a service's router (launcher/service/controller.py)."""

from __future__ import annotations

from typing import Dict


def serve_settings(serve, continues: bool, model_name: str, tokenizer: str) -> Dict:
    """FrontendConfig's fields from `serve` (launcher/schema.py ServeConfig): routing, migration, health.
    continues: the engine can continue a request elsewhere (Engine.continues_requests); tokenizer: the model's, which
    kv routing cuts prompts into token blocks with."""
    return dict(
        model_name=model_name,
        drain_timeout_s=float(serve.drain_timeout_s),
        routing=str(serve.routing),
        tokenizer=tokenizer if serve.routing == "kv" else "",
        max_migrations=int(serve.max_migrations) if continues else 0,
        stall_timeout_s=float(serve.stall_timeout_s),
        breaker_errors=int(serve.breaker_errors),
        breaker_cooldown_s=float(serve.breaker_cooldown_s),
    )
