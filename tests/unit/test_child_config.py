"""A child service's config as data (launcher/procs/config.py, launcher/procs/child.py): the front end's and the
OpenAI API's configs go to their processes as one JSON file and come back as the same dataclass; a file with an
unknown key, a missing one or a value of the wrong type is refused naming the field."""

from __future__ import annotations

import dataclasses
import json
import sys

import pytest

from launcher.frontend import FrontendConfig, FrontendProcess
from launcher.openai_api.process import OpenAIConfig, OpenAIProcess
from launcher.procs.config import ConfigError, field_comments


def _frontend(**kw) -> FrontendConfig:
    return FrontendConfig(
        [("10.0.0.1", 9001), ("10.0.0.2", 9002)],
        "0.0.0.0",
        8001,
        8002,
        "hf_model",
        processes=3,
        drain_timeout_s=12.5,
        routing="kv",
        replica_metrics=["http://10.0.0.1:9003/metrics", ""],
        kv_events=["tcp://10.0.0.1:5557", ""],
        tokenizer="/models/tiny",
        **kw,
    )


def _api(**kw) -> OpenAIConfig:
    return OpenAIConfig(
        "127.0.0.1:8001", "hf_model", "0.0.0.0", 8004, "/models/tiny", ("tiny",), 9.0, 2, "/secrets/api.key", **kw
    )


def test_the_front_ends_config_comes_back_from_its_json_as_it_was():
    cfg = _frontend()
    back = FrontendConfig.from_json(cfg.to_json())
    assert back == cfg and back.replicas == [("10.0.0.1", 9001), ("10.0.0.2", 9002)]
    assert back.addrs == ["10.0.0.1:9001", "10.0.0.2:9002"]
    assert json.loads(cfg.to_json())["replicas"] == [["10.0.0.1", 9001], ["10.0.0.2", 9002]]
    assert "addrs" not in json.loads(cfg.to_json())  # derived from the replicas, not a second copy


def test_the_apis_config_comes_back_from_its_json_as_it_was_and_names_the_key_file_only(tmp_path):
    cfg = _api()
    path = cfg.write(tmp_path / "openai.json")
    back = OpenAIConfig.read(path)
    assert back == cfg and back.aliases == ("tiny",) and back.drain_timeout_s == 9.0
    assert json.loads(path.read_text())["api_key_file"] == "/secrets/api.key"
    assert [p.name for p in tmp_path.iterdir()] == ["openai.json"]  # written whole: no temporary file left


def test_a_key_left_out_takes_the_dataclass_default():
    back = FrontendConfig.from_json(json.dumps({"replicas": [["h", 1]], "port": 7}))
    assert back == FrontendConfig([("h", 1)], port=7)
    assert back.host == "127.0.0.1" and back.processes == 1 and back.routing == "least_outstanding"
    # an integer where the field is a number is that number
    whole = json.loads(_api().to_json())
    assert OpenAIConfig.from_json(json.dumps({**whole, "drain_timeout_s": 5})).drain_timeout_s == 5.0


@pytest.mark.parametrize(
    "change, named",
    [
        ({"prot": 8001}, "unknown key(s) ['prot']: FrontendConfig has"),
        ({"port": "8001"}, 'FrontendConfig.port must be an integer, got "8001"'),
        ({"port": True}, "FrontendConfig.port must be an integer, got true"),
        ({"port": 8001.5}, "FrontendConfig.port must be an integer, got 8001.5"),
        ({"replicas": [["h", "9001"]]}, 'FrontendConfig.replicas[0][1] must be an integer, got "9001"'),
        ({"replicas": [["h", 9001, 1]]}, "FrontendConfig.replicas[0] must be a list [string, integer]"),
        ({"replicas": "h:9001"}, "FrontendConfig.replicas must be a list [[string, integer], ...]"),
        ({"kv_events": [1]}, "FrontendConfig.kv_events[0] must be a string, got 1"),
        ({"probe_interval_s": "2"}, 'FrontendConfig.probe_interval_s must be a number, got "2"'),
        ({"tokenizer": None}, "FrontendConfig.tokenizer must be a string, got null"),
        # the dataclass's own checks across fields, on what the file gives
        ({"routing": "random"}, "FrontendConfig.routing is 'random': give one of least_outstanding, prefix, kv"),
        ({"processes": 0}, "FrontendConfig.processes is 0: at least 1 process serves"),
        ({"tokenizer": ""}, "FrontendConfig.routing kv needs kv_events once a replica (got 2 for 2"),
        ({"kv_events": ["tcp://h:1"]}, "FrontendConfig.routing kv needs kv_events once a replica (got 1 for 2"),
        ({"replica_metrics": ["u"]}, "FrontendConfig.replica_metrics has 1 URLs for 2 replicas"),
    ],
)
def test_a_front_end_config_file_that_is_wrong_is_refused_naming_the_field(change, named):
    text = json.dumps({**json.loads(_frontend().to_json()), **change})
    with pytest.raises(ConfigError) as e:
        FrontendConfig.from_json(text, "/run/frontend.json")
    assert str(e.value).startswith("/run/frontend.json: ") and named in str(e.value), str(e.value)


@pytest.mark.parametrize(
    "text, named",
    [
        ('{"grpc_url": "h:1", "model": "m", "host": "h"}', "missing key(s) ['port']: OpenAIConfig has no default"),
        ('{"grpc_url": "h:1", "model": "m", "host": "h", "port": 1, "api_key": "k"}', "unknown key(s) ['api_key']"),
        ('{"grpc_url": "h:1", "model": "m", "host": "h", "port": 1, "aliases": "tiny"}', "aliases must be a list"),
        ('{"grpc_url": "h:1", "model": "m", "host": "h", "port": 1, "processes": 0}', "processes is 0"),
        ('{"grpc_url": "h:1", "model": "m", "host": "h", "port": 1', "not JSON"),
        ('["h:1", "m", "h", 1]', "OpenAIConfig is a JSON object of its fields, got list"),
    ],
)
def test_an_api_config_file_that_is_wrong_is_refused_naming_what(text, named):
    with pytest.raises(ConfigError) as e:
        OpenAIConfig.from_json(text)
    assert named in str(e.value), str(e.value)


@pytest.mark.parametrize("main_module", ["launcher.frontend.process", "launcher.openai_api.process"])
def test_the_child_refuses_a_bad_config_file_with_status_2_naming_the_file_and_the_field(main_module, tmp_path, capsys):
    import importlib

    main = importlib.import_module(main_module).main
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"replicas": [["h", 1]], "grpc_url": "h:1", "port": "x"}))
    with pytest.raises(SystemExit) as e:
        main(["--config", str(bad)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"{bad}: unknown key(s) [" in err, err
    with pytest.raises(SystemExit) as e:
        main(["--config", str(tmp_path / "absent.json")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"cannot read the config file {tmp_path / 'absent.json'}: No such file" in err, err


@pytest.mark.parametrize("cls", [FrontendConfig, OpenAIConfig])
def test_every_field_has_its_comment_and_help_shows_it(cls, capsys):
    comments = field_comments(cls)
    fields = [f.name for f in dataclasses.fields(cls)]
    assert [f for f in fields if not comments.get(f)] == []
    main = {FrontendConfig: "launcher.frontend.process", OpenAIConfig: "launcher.openai_api.process"}[cls]
    with pytest.raises(SystemExit):
        __import__(main, fromlist=["main"]).main(["--help"])
    out = capsys.readouterr().out
    for f in fields:
        assert f"  {f}: " in out and comments[f][:40] in " ".join(out.split()), f


def test_the_handle_gives_the_child_only_the_config_files_path(tmp_path):
    """The command line names the file and nothing of the config: no port, no replica, no key file."""
    proc = FrontendProcess(_frontend(), config_path=tmp_path / "frontend.json")
    assert proc.argv() == [
        sys.executable,
        "-m",
        "launcher.frontend",
        "--config",
        str(tmp_path / "frontend.json"),
        "--die-with-parent",
    ]


class _Sleeper(OpenAIProcess):
    """The handle's file keeping, with a child that only sleeps (no server in a unit test)."""

    drain_s = 5.0

    def argv(self):
        return [sys.executable, "-c", "import time; time.sleep(60)"]


def test_the_handle_writes_the_config_where_asked_and_keeps_it(tmp_path):
    proc = _Sleeper(_api(), config_path=tmp_path / "openai.json").start()
    try:
        assert OpenAIConfig.read(tmp_path / "openai.json") == _api()
    finally:
        proc.stop()
    assert (tmp_path / "openai.json").exists()  # the run dir's record of what the child was told


def test_without_a_path_the_config_is_a_temporary_file_removed_when_the_child_stops():
    proc = _Sleeper(_api()).start()
    try:
        path = proc.config_path
        assert path.name.startswith("llmlaunch-openai_api-") and OpenAIConfig.read(path) == _api()
    finally:
        proc.stop()
    assert not path.exists()
