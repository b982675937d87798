"""Issue 40: options are checked before any folder is made or model loaded, and foreign errors at the edges become
the project's one line with the fix.

``zoo train``'s mixture keys and attention layers (an unknown key was a TypeError after the output folder
existed); lm-eval ``reference=`` files (JSONDecodeError / AttributeError) and their vocabulary; lm-eval's model
path before its task index is built; a head-level hybrid whose config.json was edited (torch's size-mismatch
text, or, with the same shapes, other heads loaded silently); ``--ablation mean --n 1`` (every score 0).
"""

from __future__ import annotations

import json

import pytest

from gather_aggregate.cli.parser import main
from gather_aggregate.core.errors import CheckpointError, InputError, ModelLoadError


def _run(argv, capsys):
    rc = main(argv)
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert ": error: " in lines[0], lines[0]  # a project error, not "error (TypeError)"
    return lines[0]


@pytest.fixture
def no_model_loads(monkeypatch):
    import gather_aggregate.models.loading as loading

    def never(*a, **k):
        raise AssertionError("a model loaded before the options were checked")

    monkeypatch.setattr(loading, "load_model", never)


# ---- zoo train ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("extra, needle", [
    (["--mixture", '{"kvv": 0.5}'], "--mixture has no field 'kvv'; use some of kv, letter_mc"),
    (["--mixture", '{"kv_max_pairs": 4}'], "cannot set kv_max_pairs: the KV curriculum sets it; pass --kv-max"),
    (["--mixture", '{"kv": "lots"}'], "--mixture kv must be a number >= 0, got 'lots'"),
    (["--mixture", '{"kv": -1}'], "--mixture kv must be a number >= 0, got -1"),
    (["--mixture", '{"max_filler": 2.5}'], "--mixture max_filler must be a whole number >= 0"),
    (["--mixture", '{"kv_queries": [9, 3]}'], "kv_queries is a range [low, high] of whole numbers, low <= high"),
    (["--mixture", '[1, 2]'], "--mixture must be a JSON object of data.Mixture fields"),
    (["--mixture", '{"kv": 0, "letter_mc": 0, "content_mc": 0, "knowledge": 0}'], "every document kind weight 0"),
    (["--arch", "bamba", "--attn-layers", "5"], "--attn-layers 5 must list distinct layers in 0..1 (the model has "
                                                "2 layers; --n-layers sets it)"),
    (["--arch", "bamba", "--attn-layers", "1,1"], "must list distinct layers"),
    (["--arch", "llama", "--attn-layers", "0"], "--arch llama has none: drop it or pass --arch bamba"),
    (["--grow-to", "6"], "--grow-to needs --init"),
    (["--arch", "mamba1", "--grow-state", "16"], "--grow-state needs --init"),
    (["--grow-state", "16"], "--grow-state widens a Mamba-1 state; --arch llama cannot: drop it"),
    (["--arch", "mamba1", "--grow-to", "4"], "--grow-to appends Llama layers; --arch mamba1 cannot: drop it"),
])
def test_zoo_train_options_are_refused_before_the_folder_exists(tmp_path, capsys, extra, needle):
    out = tmp_path / "zoo-out"
    line = _run(["zoo", "train", "--out", str(out), "--steps", "1", *extra], capsys)
    assert needle in line, line
    assert not out.exists()


def test_the_train_api_checks_its_config_too():
    from gather_aggregate.training.train import train
    from gather_aggregate.training.train_args import TrainConfig

    with pytest.raises(InputError, match="--mixture has no field 'kvv'"):
        train(TrainConfig(out="unused", mixture={"kvv": 1.0}))


# ---- lm-eval reference files -------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, text, needle", [
    ("ref.json", '["a prompt", ', r"ref.json is not JSON \(.*line 1\); write a list of prompts"),
    ("ref.json", '{"prompt": "one"}', "holds a JSON dict, not a list of prompts"),
    ("ref.json", '["fine", 7]', "reference row 1 is '7'; each row must be a non-empty string"),
    ("ref.json", '[{"text": "fine"}, {"question": "no"}]', "reference row 1 is .*'prompt' or 'text' field"),
    ("ref.jsonl", '"ok"\n{bad\n', r"ref.jsonl line 2 is not JSON"),
    ("ref.json", "[]", "holds no reference prompts"),
])
def test_reference_files_are_one_line_naming_the_fix(tmp_path, name, text, needle):
    from gather_aggregate.lm_eval.intervention import reference_prompts

    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(InputError, match=needle) as err:
        reference_prompts(str(path), None, 8)
    assert "\n" not in str(err.value)


def test_reference_prompts_of_another_vocabulary_are_refused(tmp_path):
    from gather_aggregate import load_model
    from gather_aggregate.lm_eval.intervention import Intervention
    from gather_aggregate.zoo import zoo_path

    model = load_model(zoo_path("llama-kv"))
    ref = tmp_path / "ref.txt"
    ref.write_text("Quelle est la capitale de la France ?\n\nZürich liegt am See.")
    spec = Intervention.from_args(ablate="0.1", method="mean", reference=str(ref))
    with pytest.raises(InputError, match=r"tokens are unknown to this model's tokenizer.*pass prompts in the model's "
                                         r"vocabulary \(reference=kv"):
        spec.hooks(model, str(zoo_path("llama-kv")))
    assert len(Intervention.from_args(ablate="0.1", method="mean", reference="kv").hooks(
        model, str(zoo_path("llama-kv")))) == 1  # the model's own task as reference is fine


@pytest.fixture
def no_task_index(monkeypatch):
    import gather_aggregate.lm_eval.schedule as schedule

    def never(*a, **k):
        raise AssertionError("lm-eval's task index was built before the options were checked")

    monkeypatch.setattr(schedule, "task_manager", never)


@pytest.mark.parametrize("model, needle", [
    ("./no/such/model", "no such model directory"),
    ("FOLDER", "config.json"),
])
def test_lm_eval_checks_the_model_path_before_the_task_index(tmp_path, capsys, no_task_index, model, needle):
    pytest.importorskip("lm_eval")
    folder = tmp_path / "empty-folder"
    folder.mkdir()
    line = _run(["lm-eval", "--model", str(folder) if model == "FOLDER" else model, "--tasks", "ga_kv",
                 "--out", str(tmp_path / "o")], capsys)
    assert needle in line, line
    assert not (tmp_path / "o").exists()


def test_lm_eval_checks_a_reference_file_before_the_task_index(tmp_path, capsys, no_task_index):
    pytest.importorskip("lm_eval")
    ref = tmp_path / "ref.json"
    ref.write_text("{not json")
    line = _run(["lm-eval", "--model", "llama-kv", "--tasks", "ga_kv", "--ablation", "mean", "--reference", str(ref),
                 "--heads", "L0H1", "--out", str(tmp_path / "o")], capsys)
    assert "ref.json is not JSON" in line and not (tmp_path / "o").exists()


# ---- head-level hybrid checkpoints -------------------------------------------------------------------------------
@pytest.fixture
def saved_hybrid(tmp_path):
    from pathlib import Path

    import gather_aggregate.zoo
    from gather_aggregate.models.head_hybrid.model import load_head_hybrid

    model = load_head_hybrid(Path(gather_aggregate.zoo.__file__).parent / "hybrids" / "llama-kvmc-detector-k2")
    model.save_pretrained(tmp_path / "hybrid")
    return tmp_path / "hybrid"


def _edit(path, **fields):
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(fields)
    (path / "config.json").write_text(json.dumps(cfg))


def test_an_edited_state_size_names_the_tensor_both_shapes_and_the_fix(saved_hybrid):
    from gather_aggregate import load_model

    _edit(saved_hybrid, d_state=8)
    with pytest.raises(CheckpointError, match=r"model.safetensors does not match config.json: \S+ is \(.*\) in the "
                                              r"checkpoint but \(.*\) for the config \(\d+ tensors differ\); config.json "
                                              r"was edited .*save_pretrained") as err:
        load_model(saved_hybrid, tokenizer=False)
    assert "\n" not in str(err.value) and "size mismatch" not in str(err.value)


def test_edited_kept_heads_of_the_same_shapes_are_refused(saved_hybrid):
    from gather_aggregate import load_model

    cfg = json.loads((saved_hybrid / "config.json").read_text())
    moved = [[(h + 1) % cfg["n_heads"] for h in hs] for hs in cfg["kept"]]  # other heads, the same counts
    _edit(saved_hybrid, kept=moved)
    with pytest.raises(CheckpointError, match=r"config.json keeps heads .* but the weights were saved keeping "
                                              r"\[\[2\], \[3\], \[\], \[\]\] \(same shapes, other heads\)"):
        load_model(saved_hybrid, tokenizer=False)


def test_an_unedited_hybrid_loads(saved_hybrid):
    from gather_aggregate import load_model

    assert load_model(saved_hybrid, tokenizer=False).cfg.kept == ((2,), (3,), (), ())


# ---- one-prompt baselines on the command line --------------------------------------------------------------------
@pytest.mark.parametrize("command, method", [("scan", "mean"), ("scan", "resample"), ("ablate", "mean")])
def test_a_baseline_over_one_prompt_is_refused_before_the_model_loads(tmp_path, capsys, no_model_loads, command,
                                                                      method):
    extra = ["--heads", "0.1"] if command == "ablate" else []
    line = _run([command, "--model", "llama-kv", "--n", "1", "--ablation", method, "--out", str(tmp_path / "o"),
                 *extra], capsys)
    assert f"--ablation {method} over --n 1 prompt replaces each head by its own output" in line
    assert "pass --n 2 or more" in line and not (tmp_path / "o").exists()


def test_load_model_of_a_folder_without_config_is_a_model_load_error(tmp_path):
    from gather_aggregate.lm_eval.schedule import check_model_source

    with pytest.raises(ModelLoadError, match="config.json"):
        check_model_source(str(tmp_path))


def test_a_transformer_whose_config_was_edited_names_the_tensor_and_both_shapes(tmp_path):
    import shutil

    from gather_aggregate import load_model
    from gather_aggregate.zoo import zoo_path

    shutil.copytree(zoo_path("llama-kv"), tmp_path / "m")
    _edit(tmp_path / "m", num_key_value_heads=2)
    with pytest.raises(CheckpointError, match=r"model.layers.0.self_attn.k_proj.weight is \(128, 128\) in the "
                                              r"checkpoint but \(64, 128\) for the config; 4 tensors differ\); .*"
                                              r"restore config.json") as err:
        load_model(tmp_path / "m")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("extra, needle", [
    (["--init", "NOWHERE"], "is not a model directory (no config.json)"),
    (["--arch", "mamba2", "--init", "ZOO"], "holds a 'llama' model, not --arch 'mamba2'"),
    (["--init", "ZOO", "--grow-to", "1"], "--grow-to 1 is below the --init checkpoint's"),
    (["--arch", "mamba1", "--init", "MAMBA1", "--grow-state", "4"],
     "--grow-state 4 is below the --init checkpoint's state size 8; pass --grow-state 8 or more"),
])
def test_zoo_train_warm_starts_are_checked_before_the_folder_exists(tmp_path, capsys, extra, needle):
    from gather_aggregate.zoo import zoo_path

    extra = [str(tmp_path / "nowhere") if x == "NOWHERE" else str(zoo_path("llama-kv")) if x == "ZOO"
             else str(zoo_path("mamba1-ga")) if x == "MAMBA1" else x
             for x in extra]
    line = _run(["zoo", "train", "--out", str(tmp_path / "o"), "--steps", "1", *extra], capsys)
    assert needle in line, line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("model_args, error, needle", [
    ("pretrained=./no/such/model", ModelLoadError, "no such model directory"),
    ("pretrained=llama-kv,method=mean,reference=BAD", InputError, r"bad.json is not JSON .*write a list of prompts"),
])
def test_lm_evals_own_cli_checks_the_model_args_before_its_task_index(tmp_path, model_args, error, needle):
    from gather_aggregate.lm_eval.__main__ import precheck

    (tmp_path / "bad.json").write_text("{")
    argv = ["--model", "gather_aggregate", "--model_args", model_args.replace("BAD", str(tmp_path / "bad.json")),
            "--tasks", "mmlu"]
    with pytest.raises(error, match=needle):
        precheck(argv)
    precheck(["--model", "gather_aggregate", "--model_args", "pretrained=llama-kv", "--tasks", "mmlu"])  # fine
