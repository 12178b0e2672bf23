"""The model an importer's launch configuration names (estimator/importers/models.py named_model): a bundled preset
by its Hub id or folder name, else a Hugging Face id as given, else a ConfigError naming the field by its label, the
value and what is allowed."""

from __future__ import annotations

import pytest

from estimator.importers import import_config
from estimator.importers.models import named_model
from estimator.spec.errors import ConfigError


def test_a_bundled_model_by_hub_id_or_folder_and_any_other_hub_id_as_given():
    assert named_model("meta-llama/Meta-Llama-3.1-8B-Instruct", "base_model", "a Hugging Face id") == "llama-3.1-8b"
    assert named_model("/data/Qwen3-8B", "--model", "a Hugging Face id") == "qwen3-8b"
    assert named_model("some-org/some-model", "--model", "a Hugging Face id") == "some-org/some-model"


def test_anything_else_is_refused_with_the_label_the_value_and_what_is_allowed():
    with pytest.raises(ConfigError) as e:
        named_model("/data/mymodel", "base_model", "a Hugging Face id (org/name)")
    assert (e.value.field, e.value.value, e.value.reason) == ("base_model", "/data/mymodel", "")
    assert str(e.value) == "base_model = '/data/mymodel': allowed: a Hugging Face id (org/name)"
    with pytest.raises(ConfigError) as e:  # not a string: refused, not a traceback
        named_model(5, "base_model", "a Hugging Face id (org/name)")
    assert str(e.value) == "base_model = 5: allowed: a Hugging Face id (org/name)"
    # the value shown may be another than the one looked up (Megatron-Bridge: the recipe, not its Hub id)
    with pytest.raises(ConfigError) as e:
        named_model("/ckpt", "--recipe", "a recipe whose model is a Hugging Face id", "why", value="my_recipe")
    assert str(e.value) == "--recipe = 'my_recipe': why; allowed: a recipe whose model is a Hugging Face id"


@pytest.mark.parametrize("kind, text, field", [
    ("axolotl", "base_model: /data/mymodel\n", "base_model"),
    ("llama-factory", "model_name_or_path: /data/mymodel\nstage: sft\n", "model_name_or_path"),
    ("verl", "actor_rollout_ref:\n  model:\n    path: /data/mymodel\n", "actor_rollout_ref.model.path"),
    ("vllm", "vllm serve /data/mymodel", "--model"),
    ("hf", '{"model_name_or_path": "/data/mymodel"}', "model_name_or_path"),
    ("slime", "python train.py --hf-checkpoint /data/mymodel", "--hf-checkpoint"),
])
def test_each_importer_refuses_a_model_it_cannot_find_offline_naming_its_field(kind, text, field):
    with pytest.raises(ConfigError) as e:
        import_config(text, kind)
    assert (e.value.field, e.value.value) == (field, "/data/mymodel")
    assert "a Hugging Face id (org/name)" in e.value.allowed
