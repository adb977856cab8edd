"""``ServedAdapters`` on a real engine: what each load or unload reports, what the heartbeat
then shows, and which adapter names a job may use. One tiny engine (two adapter slots)
serves the module; a second one has LoRA off."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers.engine_run import one_torch_thread
from helpers.worker_fixtures import TINY

from kvrelay.protocol import AdapterMessage, decode_control, encode_control
from kvrelay_worker.engine import LLM
from kvrelay_worker.engine.llm_engine import LLMEngine
from kvrelay_worker.served_adapters import (
    AdapterSettingError,
    ServedAdapters,
    parse_lora_modules,
)


def _engine(folder: Path, max_loras: int) -> LLMEngine:
    return LLM(str(folder), device="cpu", dtype="float32", num_kv_blocks=64,
               max_model_len=256, max_loras=max_loras).engine


@pytest.fixture(scope="module")
def engine(tiny_model: Callable[[str], Path]) -> Iterator[LLMEngine]:
    with one_torch_thread():
        yield _engine(tiny_model(TINY), max_loras=2)


def _message(action: str, name: str, path: Path | None = None,
             model: str | None = TINY) -> AdapterMessage:
    """A message as it arrives: through the control channel's encoding."""
    sent = AdapterMessage(action=action, name=name,  # type: ignore[arg-type]
                          path=None if path is None else str(path), model=model,
                          request_id=f"{action}-{name}")
    decoded = decode_control(encode_control(sent))
    assert isinstance(decoded, AdapterMessage)
    return decoded


def test_load_replace_and_unload_are_reported(engine: LLMEngine,
                                              lora_adapters: dict[str, Path]) -> None:
    served = ServedAdapters(TINY)
    served.apply(engine, _message("load", "tone", lora_adapters["tone"]))
    assert [(a.name, a.base, a.path) for a in served.advertised()] == [
        ("tone", TINY, str(lora_adapters["tone"].resolve()))]
    assert served.refusal("tone") is None
    assert [info.name for info in engine.list_loras()] == ["tone"]

    served.apply(engine, _message("load", "tone", lora_adapters["style"]))  # replaces it
    served.apply(engine, _message("unload", "tone"))
    assert served.advertised() == []
    assert engine.list_loras() == []
    refusal = served.refusal("tone")
    assert refusal is not None
    assert "holds no adapter 'tone'" in refusal
    assert [(r.request_id, r.ok) for r in served.results()] == [
        ("load-tone", True), ("load-tone", True), ("unload-tone", True)]
    assert "replaced" in served.results()[1].message


def test_refusals_are_reported_not_raised(engine: LLMEngine, tmp_path: Path,
                                          lora_adapters: dict[str, Path]) -> None:
    served = ServedAdapters(TINY)
    served.apply(engine, _message("load", "x", tmp_path / "missing"))
    served.apply(engine, _message("load", "y", tmp_path))  # a folder, but not PEFT's
    served.apply(engine, _message("load", TINY, lora_adapters["tone"]))  # the base's name
    served.apply(engine, _message("unload", "never-loaded"))  # aimed at this model
    served.apply(engine, _message("unload", "never-loaded", model=None))  # a broadcast
    reports = {r.name: r for r in served.results()}
    assert set(reports) == {"x", "y", TINY, "never-loaded"}  # the broadcast got no answer
    assert not any(r.ok for r in reports.values())
    assert "no adapter folder" in reports["x"].message
    assert "adapter_config.json" in reports["y"].message
    assert "named like its base model" in reports[TINY].message
    assert "holds no adapter" in reports["never-loaded"].message
    assert served.advertised() == []


def test_lora_off_says_which_setting_turns_it_on(tiny_model: Callable[[str], Path],
                                                 lora_adapters: dict[str, Path]) -> None:
    with one_torch_thread():
        engine = _engine(tiny_model(TINY), max_loras=0)
    served = ServedAdapters(TINY)
    served.apply(engine, _message("load", "tone", lora_adapters["tone"]))
    (report,) = served.results()
    assert not report.ok
    assert "KVRELAY_MAX_LORAS" in report.message
    with pytest.raises(AdapterSettingError, match="could not load adapter 'tone'"):
        served.load_at_start(engine, [("tone", str(lora_adapters["tone"]))])


def test_modules_setting_is_parsed_strictly() -> None:
    assert parse_lora_modules(" a=/x , b=/y/z ,") == [("a", "/x"), ("b", "/y/z")]
    assert parse_lora_modules("") == []
    for bad, why in (("a", "name=path"), ("=/x", "name=path"), ("a b=/x", "adapter name"),
                     ("a=/x,a=/y", "twice"), ("{a}=/x", "adapter name")):
        with pytest.raises(AdapterSettingError, match=why):
            parse_lora_modules(bad)
