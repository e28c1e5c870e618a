"""An example recommender service: FastAPI on uvicorn, scoring with a pool of
VW engines, reloading the model while it serves, with Prometheus metrics.

Run it from this folder, with subwabbit installed from a checkout
(``pip install '.[service]'`` at the checkout's root) and a model trained for
its formatter (``python train.py /models/current.vw`` makes a toy one)::

    MODEL_PATH=/models/current.vw uvicorn app:app --host 127.0.0.1 --port 8000

* ``POST /recommend`` ``{"user": 7, "items": [1, 2, 3], "timeout_ms": 10}`` returns
  ``{"scores": [...], "model_generation": 0}``: the scores of the longest
  prefix of items that fits the budget, and which model gave them
  (``null`` when no engine was free before the deadline: ``scores`` is then
  empty). The budget covers scoring only, not reading the request or
  writing the answer.
* ``POST /reload`` ``{"model_path": "/models/current.vw"}`` swaps the model with
  no failed request and returns the new generation. It loads any file the
  server can read: keep it off the public network.
* ``GET /metrics`` is Prometheus' text format.

Settings come from the environment: ``MODEL_PATH`` (required; an absolute
path), ``POOL_SIZE`` (default: the CPUs this process may use, divided
between ``WEB_CONCURRENCY`` worker processes), ``VW_ARGS`` (extra
arguments), ``LOG_LEVEL`` (default ``INFO``).
"""

import contextlib
import gc
import logging
import os
import shlex
from typing import Any, AsyncIterator, Dict, List, Optional

from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from pydantic import BaseModel, Field

from subwabbit import AsyncVowpalWabbitPool, VowpalWabbitBaseFormatter, VowpalWabbitStartupError
from subwabbit.cpus import usable_cpus
from subwabbit.prometheus import metrics_hook, register_pool

#: The most items one request may ask to score.
MAX_ITEMS = 20_000
#: The longest budget a request may ask for, in milliseconds.
MAX_TIMEOUT_MS = 1_000.0

# subwabbit logs an engine's failure, its replacement and a reload's trouble
# on the "subwabbit" logger; uvicorn sets up only its own loggers.
logging.basicConfig(level=os.environ.get("LOG_LEVEL", "INFO").upper(),
                    format="%(asctime)s %(levelname)s %(name)s: %(message)s")


class Formatter(VowpalWabbitBaseFormatter):
    """A user namespace and an item namespace (yours will have more)."""

    def format_common_features(self, common_features: Any, debug_info: Any = None) -> str:
        return f"|u u{common_features['user']}"

    def format_item_features(self, common_features: Any, item_features: Any,
                             debug_info: Any = None) -> str:
        return f"|i i{item_features} c{item_features % 7}"


def vw_args(model_path: str) -> List[str]:
    return ["-i", model_path, "-t", "--quiet"] + shlex.split(os.environ.get("VW_ARGS", ""))


def pool_size() -> Optional[int]:
    """``POOL_SIZE``, or the usable CPUs shared between the worker processes."""
    if os.environ.get("POOL_SIZE"):
        return int(os.environ["POOL_SIZE"])
    workers = int(os.environ.get("WEB_CONCURRENCY", "1") or 1)
    return max(1, usable_cpus() // max(1, workers))


class RecommendRequest(BaseModel):
    user: int
    items: List[int] = Field(max_length=MAX_ITEMS)
    timeout_ms: float = Field(default=10.0, ge=0.0, le=MAX_TIMEOUT_MS)


class ReloadRequest(BaseModel):
    model_path: str


registry = CollectorRegistry()
items_requested = Counter("recommend_items_requested", "Items requests asked to score",
                          registry=registry)
items_scored = Counter("recommend_items_scored", "Items scored within their budget",
                       registry=registry)
empty_answers = Counter("recommend_empty_answers", "Requests answered with no score",
                        registry=registry)
#: one hook for the process: its series are registered once, whatever pool it serves
record_call = metrics_hook(registry)
state: Dict[str, AsyncVowpalWabbitPool] = {}


@contextlib.asynccontextmanager
async def lifespan(_: FastAPI) -> AsyncIterator[None]:
    pool = AsyncVowpalWabbitPool(Formatter(), vw_args(os.environ["MODEL_PATH"]),
                                 size=pool_size(), metrics_hook=record_call)
    # The pool's series leave the registry with it, so that a service (or a
    # test client) that starts the app again exports its new pool instead.
    collector = register_pool(pool, registry)
    try:
        async with pool:
            state["pool"] = pool
            gc.freeze()  # what lives as long as the service: the collector skips it
            yield
    finally:
        registry.unregister(collector)


app = FastAPI(lifespan=lifespan)

#: The largest request body read: 20,000 items of up to 20 digits, with room.
MAX_BODY_BYTES = 1 << 20


class LimitBody:
    """Refuse (413) a request body over ``limit`` bytes, whether its
    ``Content-Length`` says so at once or its chunks add up to more while it
    is read (a chunked body has no length to check first)."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = f"the body must be at most {self.limit} bytes"
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            await JSONResponse({"detail": too_large}, status_code=413)(scope, receive, send)
            return
        received = 0

        async def limited_receive() -> Dict[str, Any]:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:  # FastAPI turns this into the response
                    raise HTTPException(status_code=413, detail=too_large)
            return message

        await self.app(scope, limited_receive, send)


app.add_middleware(LimitBody, limit=MAX_BODY_BYTES)


@app.exception_handler(RequestValidationError)
async def invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
    # Not the default handler: it echoes the input (a 2 MB list back) and
    # fails with a 500 on NaN or Infinity, which it cannot write as JSON.
    return JSONResponse({"detail": [{"loc": list(error["loc"]), "msg": error["msg"],
                                     "type": error["type"]} for error in exc.errors()[:10]]},
                        status_code=422)


@app.post("/recommend")
async def recommend(request: RecommendRequest) -> Dict[str, Any]:
    metrics: Dict[str, Any] = {}
    scores = await state["pool"].predict({"user": request.user}, request.items,
                                         timeout=request.timeout_ms / 1000, metrics=metrics)
    items_requested.inc(len(request.items))
    items_scored.inc(len(scores))
    if request.items and not scores:
        empty_answers.inc()
    return {"scores": scores, "model_generation": metrics["model_generation"]}


@app.post("/reload")
async def reload(request: ReloadRequest) -> Dict[str, int]:
    pool = state["pool"]
    try:
        await pool.reload(vw_args(request.model_path))
    except VowpalWabbitStartupError as exc:
        raise HTTPException(status_code=400, detail=f"the model did not load: {exc}") from exc
    except ValueError as exc:  # say, a model of another kind than the one served
        raise HTTPException(status_code=400, detail=f"the model was refused: {exc}") from exc
    return {"generation": pool.generation}


@app.get("/metrics")
def metrics() -> Response:
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
