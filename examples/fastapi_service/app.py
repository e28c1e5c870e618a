"""An example recommender service: FastAPI on uvicorn, scoring with a pool of
VW engines, reloading the model while it serves, with Prometheus metrics.

Run it (from this folder, with ``pip install 'subwabbit[service]'``)::

    MODEL_PATH=/path/to/model.vw uvicorn app:app --host 127.0.0.1 --port 8000

* ``POST /recommend`` ``{"user": 7, "items": [1, 2, 3], "timeout_ms": 10}`` returns
  ``{"scores": [...], "model_generation": 0}``: the scores of the longest
  prefix of items that fits the budget, and which model gave them.
* ``POST /reload`` ``{"model_path": "/path/to/new.vw"}`` swaps the model with
  no failed request and returns the new generation.
* ``GET /metrics`` is Prometheus' text format.

Settings come from the environment: ``MODEL_PATH`` (required), ``POOL_SIZE``
(default: the CPUs this process may use), ``VW_ARGS`` (extra arguments).
"""

import contextlib
import os
import shlex
from typing import Any, AsyncIterator, Dict, List

from fastapi import FastAPI, HTTPException, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import BaseModel

from subwabbit import AsyncVowpalWabbitPool, VowpalWabbitBaseFormatter, VowpalWabbitStartupError
from subwabbit.prometheus import metrics_hook, register_pool


class Formatter(VowpalWabbitBaseFormatter):
    """A user namespace and an item namespace (yours will have more)."""

    def format_common_features(self, common_features: Any, debug_info: Any = None) -> str:
        return f"|u u{common_features['user']}"

    def format_item_features(self, common_features: Any, item_features: Any,
                             debug_info: Any = None) -> str:
        return f"|i i{item_features} c{item_features % 7}"


def vw_args(model_path: str) -> List[str]:
    return ["-i", model_path, "-t", "--quiet"] + shlex.split(os.environ.get("VW_ARGS", ""))


class RecommendRequest(BaseModel):
    user: int
    items: List[int]
    timeout_ms: float = 10.0


class ReloadRequest(BaseModel):
    model_path: str


registry = CollectorRegistry()
state: Dict[str, AsyncVowpalWabbitPool] = {}


@contextlib.asynccontextmanager
async def lifespan(_: FastAPI) -> AsyncIterator[None]:
    size = int(os.environ["POOL_SIZE"]) if os.environ.get("POOL_SIZE") else None
    pool = AsyncVowpalWabbitPool(Formatter(), vw_args(os.environ["MODEL_PATH"]), size=size,
                                 metrics_hook=metrics_hook(registry))
    register_pool(pool, registry)
    async with pool:
        state["pool"] = pool
        yield


app = FastAPI(lifespan=lifespan)


@app.post("/recommend")
async def recommend(request: RecommendRequest) -> Dict[str, Any]:
    metrics: Dict[str, Any] = {}
    scores = await state["pool"].predict({"user": request.user}, request.items,
                                         timeout=request.timeout_ms / 1000, metrics=metrics)
    return {"scores": scores, "model_generation": metrics["model_generation"]}


@app.post("/reload")
async def reload(request: ReloadRequest) -> Dict[str, int]:
    pool = state["pool"]
    try:
        await pool.reload(vw_args(request.model_path))
    except VowpalWabbitStartupError as exc:
        raise HTTPException(status_code=400, detail=f"the model did not load: {exc}") from exc
    return {"generation": pool.generation}


@app.get("/metrics")
def metrics() -> Response:
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
