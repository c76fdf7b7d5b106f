"""Clients people point at `minillm serve`, driven as they ship against a real server on `tiny`:
LangChain's ChatOpenAI (answers checked against `LLM.generate`, and what the server refuses seen
as an error rather than a silent None) and a short guidellm benchmark (every request served, its
latencies reported). Both run offline: the server is local, and guidellm's tokenizer and prompts
come from the shipped model's folder and its own synthetic text.

LiteLLM is left out: it adds about 250 MB (boto3 and its own 200 MB) and fetches a price list from
the internet when it is imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from functools import reduce
from operator import add

import httpx
import openai
import pytest
from pydantic import BaseModel

from minillm import LLM, SamplingParams
from minillm.entrypoints.background import BackgroundServer
from minillm.models.loader import resolve_model_path

ENGINE = {"dtype": "float32", "max_model_len": 128, "max_num_seqs": 16}
MAX_TOKENS = 12
# Prompts `tiny` answers each in its own way within MAX_TOKENS (to many, "# - - - ..."), so that an
# answer given to the wrong prompt shows.
PROMPTS = ["def fibonacci(n):", "import numpy as np", "for i in range(10):"]


@pytest.fixture(scope="module")
def server() -> Iterator[BackgroundServer]:
    with BackgroundServer("tiny", **ENGINE) as s:
        yield s


@pytest.fixture(scope="module")
def model_name(server: BackgroundServer) -> str:
    """The name the server lists its model under, which is what a client is configured with."""
    return httpx.get(server.base_url + "/models", timeout=10).json()["data"][0]["id"]


@pytest.fixture(scope="module")
def reference() -> dict[str, str]:
    """The engine's own greedy answer to each prompt sent as a one-message chat, rendered by the
    model's chat template as the server renders it."""
    llm = LLM("tiny", **ENGINE)
    tokenizer = llm.get_tokenizer()
    ids = [tokenizer(tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                   add_generation_prompt=True), add_special_tokens=False)["input_ids"]
           for p in PROMPTS]
    outputs = llm.generate([{"prompt_token_ids": i} for i in ids], SamplingParams(temperature=0, max_tokens=MAX_TOKENS),
                           use_tqdm=False)
    return {p: o.outputs[0].text for p, o in zip(PROMPTS, outputs)}


@pytest.fixture(scope="module")
def chat(server: BackgroundServer, model_name: str):
    langchain_openai = pytest.importorskip("langchain_openai")
    # No retries: a refused request must surface at once, not after a back-off. LangChain asks for usage
    # in a stream only from OpenAI's own URL unless told to (stream_usage), as people do with vLLM.
    return langchain_openai.ChatOpenAI(base_url=server.base_url, api_key="none", model=model_name, temperature=0,
                                       max_tokens=MAX_TOKENS, stream_usage=True, max_retries=0, timeout=60)


def test_langchain_invoke_and_stream_give_the_engines_answer(chat, reference, model_name):
    prompt = PROMPTS[0]
    whole = chat.invoke(prompt)
    assert whole.content == reference[prompt] != ""
    assert whole.response_metadata["finish_reason"] == "length"
    assert whole.response_metadata["model_name"] == model_name
    assert whole.usage_metadata["output_tokens"] == MAX_TOKENS
    chunks = list(chat.stream(prompt))
    assert len([c for c in chunks if c.content]) > 1, "the answer arrives in pieces"
    # LangChain adds chunks up as it would for its callers: text, and the usage the last chunk carries.
    streamed = reduce(add, chunks)
    assert streamed.content == whole.content
    assert streamed.usage_metadata == whole.usage_metadata


def test_langchain_batch_answers_each_prompt(chat, reference):
    # LangChain sends a batch's prompts at once from a thread pool: the engine batches them.
    assert len(set(reference.values())) == len(PROMPTS), reference
    assert [m.content for m in chat.batch(PROMPTS)] == [reference[p] for p in PROMPTS]


class Point(BaseModel):
    x: int
    y: int


@pytest.mark.parametrize("method, refused", [
    ("json_schema", "response_format"),  # LangChain's default for ChatOpenAI
    ("json_mode", "response_format"),
    ("function_calling", "tool"),  # tools and tool_choice, whichever the server reads first
])
def test_langchain_structured_output_is_refused_by_name(chat, method, refused):
    """minillm constrains no output: asked for a schema, the server refuses (400) and LangChain
    raises, naming the field, rather than parsing free text into None."""
    with pytest.raises(openai.BadRequestError, match=rf"{refused}\w* is not supported by minillm"):
        chat.with_structured_output(Point, method=method).invoke("A point on the plane.")


def test_guidellm_benchmark_serves_every_request(server, model_name, tmp_path):
    pytest.importorskip("guidellm")
    requests, output_tokens = 12, 4
    report = tmp_path / "benchmarks.json"
    # guidellm's own command, as people run it: 4 concurrent streams of chats with synthetic prompts,
    # counted in tokens by the shipped model's tokenizer (a folder: nothing is fetched). Its workers are
    # processes started afresh, each importing torch: one worker, not one per core, saves seconds.
    run = subprocess.run(
        [sys.executable, "-m", "guidellm", "run",
         "--backend", f"kind=openai_http,target={server.url},model={model_name}",
         "--profile", "kind=concurrent,streams=4",
         "--constraint", f"kind=max_requests,count={requests}",
         "--tokenizer", f"kind=huggingface_auto,model={resolve_model_path('tiny')}",
         "--data", f"kind=synthetic_text,prompt_tokens=16,output_tokens={output_tokens}",
         "--output", f"kind=json,path={report}",
         "--disable-console-interactive"],
        env={**os.environ, "GUIDELLM__MAX_WORKER_PROCESSES": "1"}, cwd=tmp_path, capture_output=True, text=True,
        timeout=120)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    (benchmark,) = json.loads(report.read_text())["benchmarks"]
    metrics = benchmark["metrics"]
    # guidellm exits with 0 though every request failed: the report says how many did.
    errors = [r["info"]["error"] for r in benchmark["requests"]["errored"]]
    assert metrics["request_totals"] == {"successful": requests, "errored": 0, "incomplete": 0,
                                         "total": requests}, errors[:3]
    tokens = metrics["output_token_count"]["successful"]
    assert tokens["min"] == tokens["max"] == output_tokens
    # A time to first token for each request, and a gap between each of its next tokens: guidellm read
    # the answers as a stream, token by token.
    ttft, itl = metrics["time_to_first_token_ms"]["successful"], metrics["inter_token_latency_ms"]["successful"]
    assert ttft["count"] == requests and ttft["min"] > 0
    assert itl["count"] == requests * (output_tokens - 1) and itl["min"] > 0
