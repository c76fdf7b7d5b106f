"""minillm: a compact, complete LLM inference engine, built up in a notebook course."""

from minillm.llm import LLM
from minillm.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from minillm.sampling_params import SamplingParams

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "Logprob", "RequestMetrics"]
