"""The official `openai` SDK runs an embeddings batch on the local stack's embedded all-MiniLM-L6-v2:
the SDK's own types parse the result bodies, similar sentences are nearer than unrelated ones, and a
base64 vector decodes to the float one."""

from __future__ import annotations

import base64
import json
import math
import struct
import time
from collections.abc import Iterator

import pytest
from openai import OpenAI
from openai.types import CreateEmbeddingResponse

from batchinfer_local import LocalStack
from support.api_stack import jsonl, new_account
from support.stacks import DEFAULT, SharedStacks

pytestmark = [pytest.mark.model, pytest.mark.timeout(180), DEFAULT.mark]
MODEL = "all-minilm-l6-v2"
CAT, CAT2, MARKETS = (
    "The cat sits on the mat.",
    "A cat is sitting on a mat.",
    "Stock markets fell sharply today.",
)


@pytest.fixture(scope="module")
def stack(shared_stacks: SharedStacks, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    with shared_stacks.lease(DEFAULT, tmp_path_factory.mktemp("openai-sdk-embeddings")) as shared:
        yield shared.stack


def line(custom_id: str, **body: object) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings", "body": body})


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def test_an_embeddings_batch_through_the_openai_sdk(stack: LocalStack) -> None:
    # Given a client of its own account, and three embeddings lines (one in base64)
    client = OpenAI(base_url=f"{stack.base_url}/v1", api_key=new_account("openai-sdk-embed"), max_retries=0)
    data = jsonl(
        line("cat", model=MODEL, input=CAT),
        line("pair", model=MODEL, input=[CAT2, MARKETS]),
        line("cat-b64", model=MODEL, input=CAT, encoding_format="base64"),
    )
    batch_file = client.files.create(file=("embed.jsonl", data), purpose="batch")

    # When the batch runs to its end
    batch = client.batches.create(
        input_file_id=batch_file.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    deadline = time.monotonic() + 120
    while batch.status not in ("completed", "failed", "expired", "cancelled"):
        assert time.monotonic() < deadline, batch.status
        time.sleep(0.5)
        batch = client.batches.retrieve(batch.id)

    # Then every line answered with OpenAI's body, similar sentences nearer than unrelated ones
    assert batch.status == "completed" and batch.request_counts is not None
    assert (batch.request_counts.completed, batch.request_counts.failed) == (3, 0)
    assert batch.output_file_id is not None
    lines = {
        item["custom_id"]: item["response"]["body"]
        for item in map(json.loads, client.files.content(batch.output_file_id).text.splitlines())
    }
    cat = CreateEmbeddingResponse.model_validate(lines["cat"]).data[0].embedding
    pair = CreateEmbeddingResponse.model_validate(lines["pair"])
    cat2, markets = pair.data[0].embedding, pair.data[1].embedding
    assert len(cat) == 384 and math.isclose(cosine(cat, cat), 1.0, abs_tol=1e-5)
    assert cosine(cat, cat2) > 0.9 > 0.2 > cosine(cat, markets)
    assert pair.model == MODEL and pair.usage.prompt_tokens == pair.usage.total_tokens == 18
    # And the base64 vector is the float one's little-endian float32 bytes (the same input gives the
    # same vector whatever shares its decode call)
    raw = base64.b64decode(lines["cat-b64"]["data"][0]["embedding"])
    assert list(struct.unpack("<384f", raw)) == cat
