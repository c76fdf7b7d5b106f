"""`AsyncLLM`: the engine loop in a background thread, serving many asyncio callers at once.

    engine = AsyncLLM("tiny")
    async for out in engine.generate("def fib(n):", SamplingParams(max_tokens=32), "req-1"):
        print(out.outputs[0].text)

One thread owns the `LLMEngine`; callers never touch it. They send commands (add, abort, read
metrics) through a queue that the thread drains between steps, and receive each step's outputs
through their own asyncio queue. torch releases the GIL inside its kernels, so the event loop
stays responsive while a step runs. vLLM runs its engine core in another process; a thread keeps
this one readable and is enough for one model on one device.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from minillm.engine.llm_engine import LLMEngine, PromptType
from minillm.engine.metrics import Metric
from minillm.outputs import RequestOutput
from minillm.sample.sampler import check_fits_tensors
from minillm.sampling_params import SamplingParams

# A command runs in the engine thread; its second part tells its caller when the engine is dead.
_Command = tuple[Callable[[], None] | None, Callable[[BaseException], None] | None]


class EngineDeadError(RuntimeError):
    """The engine loop stopped on an error; every request in flight failed with this."""


@dataclass
class _Stream:
    """Where one request's outputs go: an asyncio queue, fed from the engine thread."""

    loop: asyncio.AbstractEventLoop
    outputs: asyncio.Queue

    def put(self, item: RequestOutput | BaseException) -> bool:
        """False when the caller's event loop has closed: nobody is listening any more."""
        try:
            self.loop.call_soon_threadsafe(self.outputs.put_nowait, item)
        except RuntimeError:
            return False
        return True


class AsyncLLM:
    def __init__(self, model: str, **engine_args) -> None:
        """engine_args: as `LLM`'s. The engine loads here, in the caller's thread, so that a bad
        argument raises at once."""
        self.llm_engine = LLMEngine(model, **engine_args)
        self.model_name = self.llm_engine.model_name
        self.dead_error: EngineDeadError | None = None
        self._commands: queue.SimpleQueue[_Command] = queue.SimpleQueue()
        self._streams: dict[str, _Stream] = {}
        self._lock = threading.Lock()  # orders a submission against the loop's death
        self._thread = threading.Thread(target=self._run, name="minillm-engine", daemon=True)
        self._thread.start()

    @property
    def errored(self) -> bool:
        return self.dead_error is not None

    @property
    def is_running(self) -> bool:
        return self._thread.is_alive()

    def get_tokenizer(self):
        return self.llm_engine.tokenizer

    def add_request(self, request_id: str, prompt: PromptType, sampling_params: SamplingParams,
                    arrival_time: float | None = None) -> AsyncIterator[RequestOutput]:
        """Queue a request and return its outputs as the engine makes them (every step when streaming,
        see SamplingParams.output_kind). Bad input raises ValueError here, before anything is queued.
        A caller that stops listening (break, cancellation, a client gone) aborts the request.
        arrival_time (time.time()): when the request arrived, by default now; the engine thread picks
        it up only between steps, and its waiting until then counts in its time to first token."""
        arrival_time = time.time() if arrival_time is None else arrival_time
        text, token_ids = self.llm_engine.input_processor.process_prompt(prompt)
        self.llm_engine.input_processor.check_params(sampling_params)
        # Checked here rather than met in a step: the engine thread shares each step with every request.
        check_fits_tensors(sampling_params)
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue())

        def add() -> None:
            try:
                self.llm_engine.add_request(request_id, {"prompt": text, "prompt_token_ids": token_ids},
                                            sampling_params, arrival_time)
            except Exception as e:  # a request id already in use
                stream.put(e)
            else:
                self._streams[request_id] = stream

        self._submit(add, stream.put)
        return self._outputs(request_id, stream)

    async def generate(self, prompt: PromptType, sampling_params: SamplingParams,
                       request_id: str) -> AsyncIterator[RequestOutput]:
        """vLLM's entry point: `add_request`'s outputs, as one async generator."""
        async for out in self.add_request(request_id, prompt, sampling_params):
            yield out

    async def _outputs(self, request_id: str, stream: _Stream) -> AsyncIterator[RequestOutput]:
        finished = False
        try:
            while not finished:
                item = await stream.outputs.get()
                if isinstance(item, BaseException):
                    finished = True  # the engine holds nothing of it any more
                    raise item
                finished = item.finished
                yield item
        finally:
            if not finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        """Stop a request and free its blocks before the next step; unknown ids are ignored."""
        def abort() -> None:
            self._streams.pop(request_id, None)
            self.llm_engine.abort_request(request_id)

        self._submit(abort, lambda error: None)

    async def get_metrics(self) -> list[Metric]:
        """`LLM.get_metrics()`, read between two steps."""
        if self.errored:  # the loop is gone, so nothing moves any more: read it directly
            return self.llm_engine.get_metrics()
        return await self._call(self.llm_engine.get_metrics)

    async def check_health(self) -> None:
        """vLLM's probe: raises EngineDeadError once the loop has stopped."""
        if self.errored:
            raise self.dead_error

    def shutdown(self) -> None:
        """Stop the loop after the current step; requests still running are aborted."""
        with self._lock:
            if self._thread.is_alive():
                self._commands.put((None, None))  # the loop's last command
        self._thread.join()

    async def _call(self, fn: Callable[[], object]):
        """fn's result, computed in the engine thread; its exception is raised here."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()

        def settle(result=None, error: BaseException | None = None) -> None:
            if not future.done():  # a caller that was cancelled no longer waits
                future.set_exception(error) if error is not None else future.set_result(result)

        def command() -> None:
            try:
                result = fn()
            except Exception as e:
                loop.call_soon_threadsafe(settle, None, e)
            else:
                loop.call_soon_threadsafe(settle, result)

        self._submit(command, lambda error: loop.call_soon_threadsafe(settle, None, error))
        return await future

    def _submit(self, command: Callable[[], None], on_dead: Callable[[EngineDeadError], None]) -> None:
        with self._lock:
            if self.errored or not self._thread.is_alive():
                on_dead(self.dead_error or EngineDeadError("the engine has been shut down"))
            else:
                self._commands.put((command, on_dead))

    def _run(self) -> None:
        engine = self.llm_engine
        try:
            while True:
                # Block for work when idle; between steps, take every command that has arrived.
                item = self._commands.get() if not engine.has_unfinished_requests() else self._next_command()
                while item is not None:
                    command, _ = item
                    if command is None:
                        return self._stop()
                    command()
                    item = self._next_command()
                if engine.has_unfinished_requests():
                    self._dispatch(engine.step())
        except BaseException as e:
            self._die(e)

    def _next_command(self) -> _Command | None:
        try:
            return self._commands.get_nowait()
        except queue.Empty:
            return None

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            stream = self._streams.pop(out.request_id) if out.finished else self._streams.get(out.request_id)
            if stream is not None and not stream.put(out):
                self._streams.pop(out.request_id, None)
                self.llm_engine.abort_request(out.request_id)

    def _stop(self) -> None:
        for request_id in list(self._streams):
            self.llm_engine.abort_request(request_id)
        self._fail_all(EngineDeadError("the engine has been shut down"))

    def _die(self, error: BaseException) -> None:
        dead = EngineDeadError(f"the engine loop failed: {type(error).__name__}: {error}")
        dead.__cause__ = error
        self._fail_all(dead)

    def _fail_all(self, error: EngineDeadError) -> None:
        """Every caller still waiting, for an output or for a command, gets the error."""
        with self._lock:
            self.dead_error = error
        for stream in self._streams.values():
            stream.put(error)
        self._streams.clear()
        while (item := self._next_command()) is not None:
            if item[1] is not None:
                item[1](error)
