"""Shared prefix on the embedded model: a 32-request chat batch whose lines share one ~675-token system
prompt (a review-classification rubric), each with its own short review and `max_tokens` 8, end to end
through the local stack (create to completed), against the same batch made unshareable (each line's
system prompt starts with its own word, so no two prompts share more than the chat template's first
few tokens), in the same run and the same warm stack.

What is compared besides the seconds: the batch's `usage.input_tokens_details.cached_tokens` (the
prompt tokens the engine took from its KV cache instead of computing; the prompt tokens it computed
are the batch's prompt tokens minus those) against what the shared system prompt computed once
skips: 31 x the 668 tokens all 32 rendered prompts have in common (counted here with the model's own
tokenizer and chat template). At most, a cache of every earlier prompt skips a token more on the
lines whose review number starts like an earlier line's ("Review 1" and "Review 1x"): the engine's
cache is its 16 KV streams, so it holds only the recent prompts and may miss some of those. The
unshareable batch's cached tokens: 0 expected.
"""

from __future__ import annotations

import itertools
import json
import os
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.common import Row

MODEL = "smollm2-135m-instruct"
MAX_TOKENS = 8
N_REQUESTS = 32
RUBRIC = """You are a careful analyst who classifies customer reviews of products bought in an online \
shop. Read the review the user sends and answer with exactly one label from the list below, written in \
lower case, and nothing else: no explanation, no punctuation, no quotation marks.

Labels:
- positive: the customer is satisfied overall. They praise the product, its quality, its price, the \
delivery or the service, and any complaint they mention is minor and does not change their verdict.
- negative: the customer is dissatisfied overall. They report a defect, a broken or missing part, a \
product that does not match its description, a late or lost delivery, rude or slow service, or they \
ask for a refund or say they will not buy again.
- mixed: the review weighs real praise against real complaints of similar weight, and the customer \
neither clearly recommends the product nor clearly warns others against it.
- neutral: the review states facts without judging them (what was bought, when it arrived, how it is \
used) or asks a question, and shows no satisfaction or dissatisfaction.
- off_topic: the text is not a review of a product or of the shop: spam, an advertisement, a message \
meant for someone else, or text in which no product or purchase is discussed at all.

Rules:
1. Judge the customer's overall verdict, not the number of positive or negative words. A long list of \
small complaints followed by "but I love it" is positive; a short "nice colour" followed by "it broke \
on day two" is negative.
2. Sarcasm counts as what the customer means: "great, another charger that lasted a week" is negative.
3. Stars, scores or grades in the text count as the customer's verdict: four or five stars (or 8 to 10 \
out of 10) are positive, one or two stars (or 1 to 4 out of 10) are negative, three stars is mixed \
unless the words say otherwise.
4. A complaint about the delivery company alone, when the product itself is praised, is mixed; when \
the product is not mentioned at all, it is negative.
5. Questions to the seller ("does it fit the older model?") are neutral unless they also complain.
6. When two labels seem to fit equally well, prefer mixed over positive or negative, and neutral over \
off_topic.
7. Never answer with more than one label, never invent a label, and never add text before or after \
the label.

Examples:
Review: "Arrived a day early, fits perfectly and the fabric feels sturdy. Five stars." Label: positive
Review: "The zip broke the first time I used it and support never answered my emails." Label: negative
Review: "Lovely design, but the battery lasts half of what the listing says." Label: mixed
Review: "Ordered the blue one on Monday, it came on Thursday in a cardboard box." Label: neutral
Review: "Win a free cruise today, click the link in my profile!" Label: off_topic

Answer with the label only."""
PRODUCTS = [
    "kettle",
    "backpack",
    "desk lamp",
    "phone case",
    "blender",
    "rain jacket",
    "keyboard",
    "frying pan",
]
VERDICTS = [
    "works exactly as described and I use it every day",
    "stopped working after two weeks and the seller ignores me",
    "looks great but is much louder than I expected",
    "arrived on Tuesday in a plain box with a manual",
]
# The unshareable batch: each line's system prompt starts with one of these words, so the prompts part
# after the chat template's first tokens (fewer than the engine's minimum reuse).
WORDS = (
    "Amber Basil Cedar Delta Ember Fjord Garnet Harbor Indigo Juniper Kestrel Lagoon Maple Nectar Onyx "
    "Pebble Quartz Raven Saffron Thistle Umber Velvet Willow Xenon Yarrow Zephyr Acorn Birch Coral Dune "
    "Elm Fern"
).split()


def reviews(n: int = N_REQUESTS) -> list[str]:
    """`n` (at most 32) distinct short reviews, about 20 tokens each."""
    return [
        f"Review {i + 1}: the {product} {verdict}."
        for i, (product, verdict) in enumerate(itertools.product(PRODUCTS, VERDICTS))
    ][:n]


def system_prompts(n: int, *, shared: bool) -> list[str]:
    """The `n` lines' system prompts: the rubric on every line, or (not `shared`) each behind its own
    word."""
    return [RUBRIC if shared else f"{WORDS[i]}. {RUBRIC}" for i in range(n)]


def messages(n: int = N_REQUESTS, *, shared: bool) -> list[list[dict[str, str]]]:
    """The `n` lines' chat messages: a system prompt and one review each."""
    return [
        [{"role": "system", "content": system}, {"role": "user", "content": review}]
        for system, review in zip(system_prompts(n, shared=shared), reviews(n), strict=True)
    ]


def prompt_tokens(conversations: list[list[dict[str, str]]]) -> list[list[int]]:
    """Each conversation rendered with the model's chat template and tokenized, as the embedded backend
    does (`LlamaCppBackend._chat_prompt`), on the model's vocabulary alone."""
    import llama_cpp
    from llama_cpp import _internals as internals

    from batchinfer.backends.config import LlamaCppConfig
    from batchinfer.backends.llama_cpp import chat_formatter, find_gguf

    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    path = find_gguf(LlamaCppConfig(backend="llama_cpp").package)
    model = internals.LlamaModel(path_model=str(path), params=params, verbose=False)
    formatter = chat_formatter(model)
    prompts = []
    for conversation in conversations:
        rendered = formatter(messages=conversation)
        text = rendered.prompt.encode("utf-8")
        prompts.append(model.tokenize(text, add_bos=not rendered.added_special, special=True))
    return prompts


def common_length(prompts: list[list[int]]) -> int:
    """How many leading tokens all of `prompts` share."""
    from batchinfer.backends.llama_prefix import common_prefix

    return min(common_prefix(prompts[0], p) for p in prompts[1:])


def ideal_skip(prompts: list[list[int]]) -> int:
    """The prompt tokens a cache of every earlier prompt skips, `prompts` run in order: for each prompt
    after the first, the longest prefix it shares with an earlier one (at most all but its last
    `COMPUTED_TAIL` tokens, which the engine always computes)."""
    from batchinfer.backends.llama_prefix import COMPUTED_TAIL, common_prefix

    return sum(
        min(max(common_prefix(p, q) for q in prompts[:i]), len(p) - COMPUTED_TAIL)
        for i, p in enumerate(prompts)
        if i
    )


def batch_lines(name: str, conversations: list[list[dict[str, str]]]) -> str:
    """The batch file of `conversations`: one chat line each, custom ids `<name>-<i>`."""
    return "".join(
        json.dumps(
            {
                "custom_id": f"{name}-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": MODEL, "max_tokens": MAX_TOKENS, "temperature": 0, "messages": messages},
            }
        )
        + "\n"
        for i, messages in enumerate(conversations)
    )


@contextmanager
def stack_session() -> Iterator[Callable[[list[list[dict[str, str]]]], dict[str, Any]]]:
    """A warm local stack (a one-line batch run first: the model loaded); yields `run(conversations)`,
    which uploads a batch of them, times it from create to completed, and returns `seconds`, the
    batch's `usage` and the output lines' responses."""
    from batchinfer_local import LocalStack
    from batchinfer_local.client import BatchClient
    from benchmarks.common import Stopwatch, quiet_functions
    from benchmarks.embedded import wait_for

    quiet_functions()
    names = itertools.count()
    with tempfile.TemporaryDirectory() as tmp, LocalStack(port=0) as stack:
        client = BatchClient(f"{stack.base_url}/v1", api_key=stack.api_key, timeout=120)

        def run(conversations: list[list[dict[str, str]]]) -> dict[str, Any]:
            name = f"batch{next(names)}"
            path = Path(tmp) / f"{name}.jsonl"
            path.write_text(batch_lines(name, conversations))
            uploaded = client.upload(path)["id"]
            with Stopwatch() as watch:
                done = wait_for(stack, client, client.create(uploaded)["id"])
            assert done["status"] == "completed" and done["request_counts"]["failed"] == 0, done
            output = [json.loads(line) for line in client.content(done["output_file_id"]).splitlines()]
            return {"seconds": watch.seconds, "usage": done["usage"], "responses": output}

        run([[{"role": "user", "content": "Say hello."}]])
        yield run


def _summary(result: dict[str, Any]) -> dict[str, Any]:
    usage = result["usage"]
    per_line = [
        (o["response"]["body"]["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        for o in result["responses"]
    ]
    return {
        "seconds": result["seconds"],
        "prompt_tokens": usage["input_tokens"],
        "cached_tokens": usage["input_tokens_details"]["cached_tokens"],
        "lines_cached": sum(n > 0 for n in per_line),
        "per_line": sorted(Counter(per_line).items()),
    }


def measure(n: int = N_REQUESTS) -> dict[str, Any]:
    """The unshareable batch, then the shared one, on one warm stack: each one's seconds (create to
    completed), prompt and cached tokens (the batch's usage), lines with cached tokens and how many
    lines had each cached count (`per_line`: (cached tokens, lines) pairs); the load
    average before each and after the last; the tokens all the shared prompts have in common
    (`common`) and what a cache of every earlier prompt skips (`ideal_skip`, at least
    `(n - 1) * common`)."""
    shared, unshared = messages(n, shared=True), messages(n, shared=False)
    tokens = prompt_tokens(shared)
    loads = []
    with stack_session() as run:
        loads.append(os.getloadavg()[0])
        apart = _summary(run(unshared))
        loads.append(os.getloadavg()[0])
        together = _summary(run(shared))
        loads.append(os.getloadavg()[0])
    return {
        "n": n,
        "shared": together,
        "unshared": apart,
        "ratio": apart["seconds"] / together["seconds"],
        "common": common_length(tokens),
        "ideal_skip": ideal_skip(tokens),
        "unshared_common": common_length(prompt_tokens(unshared)),
        "loads": loads,
        "at": time.strftime("%H:%M:%S"),
    }


def report(r: dict[str, Any], rows: list[Row], notes: list[str]) -> None:
    """Add `measure`'s result `r` to `make bench`'s report: its two rows (the seconds, the cached tokens)
    and one note."""
    shared, unshared = r["shared"], r["unshared"]
    figure = f"shared prefix: {r['n']}-request batch on the embedded model through the local stack"
    once = (r["n"] - 1) * r["common"]
    rows.append(
        Row(
            f"{figure}, one ~{r['common']}-token system prompt vs each line's own (create to completed)",
            f"{shared['seconds']:.1f} s",
            f"{unshared['seconds']:.1f} s (unshareable)",
            r["ratio"],
            ">= 4",
            r["ratio"] >= 4,
        )
    )
    rows.append(
        Row(
            f"{figure}: the batch's cached_tokens vs {r['n'] - 1} x the {r['common']} tokens all its prompts "
            "share (the system prompt computed once)",
            f"{shared['cached_tokens']:,} tokens",
            f"{once:,} tokens",
            shared["cached_tokens"] / once,
            f">= 1, <= {r['ideal_skip'] / once:.4f} (every earlier prompt cached)",
            once <= shared["cached_tokens"] <= r["ideal_skip"],
        )
    )
    loads = ", ".join(f"{x:.1f}" for x in r["loads"])
    computed = shared["prompt_tokens"] - shared["cached_tokens"]
    longer = unshared["prompt_tokens"] - shared["prompt_tokens"]
    notes.append(
        f"shared_prefix (load average before each batch and after the last {loads}): shared: "
        f"{shared['prompt_tokens']:,} prompt tokens, {shared['cached_tokens']:,} cached "
        f"({shared['lines_cached']} of {r['n']} lines; cached tokens x lines "
        f"{', '.join(f'{t} x {n}' for t, n in shared['per_line'])}; {r['ideal_skip']:,} if every earlier "
        f"prompt were cached), so {computed:,} computed; unshareable: "
        f"{unshared['prompt_tokens']:,} prompt tokens, {unshared['cached_tokens']:,} cached "
        f"({unshared['lines_cached']} lines; its prompts share {r['unshared_common']} tokens); the "
        f"unshareable batch's prompt tokens minus those the shared batch computed: "
        f"{unshared['prompt_tokens'] - computed:,} (its system prompts are {longer} tokens longer in all)"
    )


if __name__ == "__main__":
    os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")
    print(measure(int(os.environ.get("N", str(N_REQUESTS)))))
