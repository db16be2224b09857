#!/usr/bin/env python3
"""Writes src/config/timm_architectures.h: timm's registered ViT architectures that vit builds, each as the "model"
section of a vit config (vit's field names are timm's constructor arguments): VisionTransformer's (vision_transformer,
deit) and Eva's (eva: EVA-02, DINOv3, RoPE-ViT, Perception Encoder; "model_class": "eva").

  .venv/bin/python scripts/timm_architectures.py > src/config/timm_architectures.h

Each architecture's constructor arguments are read from timm's own registry (its model function is called with
_create_vision_transformer intercepted, so nothing is built) and its input size from its default pretrained config.
Architectures that need what vit lacks (parallel blocks, differential attention, distillation tokens, an input size
that is not a whole number of patches) are left out. tests/test_interop.cpp (TimmPresets) checks the table against
the installed timm.
"""
import json
import sys

import timm
import timm.models.deit as deit
import timm.models.eva as eva
import timm.models.vision_transformer as vision_transformer
from timm.layers import Mlp, SwiGLU, SwiGLUPacked
from timm.models import _registry

# timm's argument -> how vit spells it (the same name unless listed).
SAME = ["patch_size", "embed_dim", "depth", "num_heads", "mlp_ratio", "qkv_bias", "class_token", "reg_tokens",
        "no_embed_class", "pre_norm", "global_pool", "final_norm", "fc_norm", "qk_norm", "init_values", "proj_bias"]
# act_layer as a name or a class -> vit's act_layer (timm's default, GELU, is vit's).
ACTIVATIONS = {"gelu_tanh": "gelu_tanh", "quick_gelu": "quick_gelu", "silu": "silu", "SiLU": "silu"}
# VisionTransformer's arguments that vit spells as Eva does.
RENAMED = {"scale_attn_norm": "scale_attn_inner", "scale_mlp_norm": "scale_mlp"}
IGNORED = {"img_size", "dynamic_img_size"}  # the size comes from the pretrained config; vit runs any size
# Eva's arguments under the same name in vit, and those vit spells otherwise.
EVA_SAME = ["patch_size", "embed_dim", "depth", "num_heads", "mlp_ratio", "qkv_bias", "qkv_fused", "qk_norm",
            "swiglu_mlp", "swiglu_align_to", "scale_mlp", "scale_attn_inner", "attn_type", "init_values",
            "attn_only_layer_scale", "class_token", "no_embed_class", "use_abs_pos_emb", "use_rot_pos_emb",
            "rope_type", "rope_grid_offset", "rope_grid_indexing", "rope_temperature", "rope_rotate_half",
            "global_pool", "attn_pool_num_heads", "attn_pool_mlp_ratio", "use_post_norm", "num_kv_heads",
            "rope_shift_coords", "rope_jitter_coords", "rope_rescale_coords"]
EVA_RENAMED = {"num_reg_tokens": "reg_tokens", "use_pre_transformer_norm": "pre_norm"}


def timm_arguments():
    """{name: (constructor kwargs, pretrained input_size)} for timm's ViT-class architectures."""
    captured = {}

    def intercept(variant, pretrained=False, **kwargs):
        captured[variant] = kwargs
        raise StopIteration

    vision_transformer._create_vision_transformer = intercept
    deit._create_deit = intercept
    eva._create_eva = intercept
    out = {}
    for name in timm.list_models():
        if _registry._model_to_module.get(name) not in ("vision_transformer", "deit", "eva") or name.startswith("test_"):
            continue
        try:
            _registry._model_entrypoints[name](pretrained=False)
        except StopIteration:
            pass
        cfg = _registry.get_pretrained_cfg(name)
        out[name] = (captured.get(name, {}), list(cfg.input_size), _registry._model_to_module[name])
    return out


def norm_kind(value):
    """(vit's norm_layer, epsilon) of a timm norm_layer (a class, a partial or get_norm_layer's name), else None."""
    func = getattr(value, "func", value)
    keywords = getattr(value, "keywords", {})
    name = func if isinstance(func, str) else getattr(func, "__name__", "")
    kind = {"LayerNorm": "layernorm", "layernorm": "layernorm", "RmsNorm": "rmsnorm", "rmsnorm": "rmsnorm"}.get(name)
    return None if kind is None else (kind, keywords.get("eps", 1e-6))


def apply_norm(section, key, value):
    """Writes norm_layer or embed_norm_layer into the section; False when vit cannot hold it (one epsilon for all)."""
    kind = norm_kind(value)
    if kind is None or section.get("layer_norm_eps", kind[1]) != kind[1]:
        return False
    if key == "norm_layer" and kind[0] != "layernorm":
        section["norm_layer"] = kind[0]
    if key == "embed_norm_layer":
        section["embed_norm_layer"] = kind[0]
    if kind[1] != 1e-6:
        section["layer_norm_eps"] = kind[1]
    return True


def activation_name(value):
    """vit's act_layer for timm's, or None."""
    return ACTIVATIONS.get(value if isinstance(value, str) else getattr(value, "__name__", ""))


def mlp_layer_name(value):
    """vit's mlp_layer for VisionTransformer's, or None."""
    if value is Mlp:
        return "mlp"
    if value is SwiGLU:
        return "swiglu"
    if value is SwiGLUPacked or (getattr(value, "func", None) is SwiGLUPacked.func and value.keywords == SwiGLUPacked.keywords):
        return "swiglu_packed"
    return None


def eva_model_section(kwargs, input_size):
    """An Eva architecture's model section, or None when it needs something vit lacks."""
    section = {"model_class": "eva"}
    for key, value in kwargs.items():
        if key in EVA_SAME:
            section[key] = list(value) if isinstance(value, tuple) else value
        elif key in EVA_RENAMED:
            section[EVA_RENAMED[key]] = value
        elif key == "ref_feat_shape":
            section[key] = list(value) if isinstance(value, tuple) else value
        elif key == "norm_layer":
            if not apply_norm(section, key, value):
                return None
        elif key in ("use_fc_norm", "use_post_transformer_norm"):
            pass  # below
        elif key not in IGNORED:
            return None  # num_kv_heads, use_post_norm, rope_rescale_coords, ...
    # Eva's defaults where vit's differ: average pooling; the final norm's place from use_fc_norm and
    # use_post_transformer_norm (both None: fc_norm exactly with avg, the norm on every token otherwise).
    section.setdefault("global_pool", "avg")
    fc = kwargs.get("use_fc_norm")
    fc = section["global_pool"] == "avg" if fc is None else fc
    post = kwargs.get("use_post_transformer_norm")
    post = not fc if post is None else post
    if fc and post:
        return None  # both norms: vit has one final norm
    if not fc and not post:
        section["final_norm"] = False
    elif fc != (section["global_pool"] == "avg"):
        section["fc_norm"] = fc
    return section


def vit_model_section(kwargs, input_size):
    """The model section, or None when the architecture needs something vit lacks."""
    section = {}
    for key, value in kwargs.items():
        if key in SAME:
            section[key] = value
        elif key in RENAMED:
            section[RENAMED[key]] = value
        elif key == "act_layer":
            if activation_name(value) is None:
                return None
            section[key] = activation_name(value)
        elif key in ("norm_layer", "embed_norm_layer"):
            if not apply_norm(section, key, value):
                return None
        elif key == "mlp_layer":
            if mlp_layer_name(value) is None:
                return None
            if mlp_layer_name(value) != "mlp":
                section[key] = mlp_layer_name(value)
        elif key not in IGNORED:
            return None
    return size_section(section, input_size)


def size_section(section, input_size):
    """The section with the pretrained input size, or None when it is not a whole number of patches."""
    c, h, w = input_size
    patch = section.get("patch_size", 16)
    if h % patch or w % patch:
        return None  # timm's convolution drops the remainder (so400m/14 at 384); vit's sizes are whole patches
    section["img_size"] = h if h == w else [h, w]
    if c != 3:
        section["in_chans"] = c
    return section


def main():
    rows = []
    for name, (kwargs, input_size, module) in sorted(timm_arguments().items()):
        if module == "eva":
            section = eva_model_section(kwargs, input_size)
            if section is not None:
                section = size_section(section, input_size)
        else:
            section = vit_model_section(kwargs, input_size)
        if section is not None:
            rows.append((name, json.dumps(section, separators=(",", ":"))))
    out = sys.stdout
    out.write("// Generated by scripts/timm_architectures.py from timm " + timm.__version__ + "'s registry: do not edit.\n")
    out.write("// timm's registered ViT architectures that vit builds, each as the \"model\" section of a config.\n")
    out.write("#pragma once\n\nnamespace vit {\n\nstruct TimmArchitecture {\n  const char* name;\n  const char* model;"
              "  // JSON\n};\n\n// clang-format off\ninline constexpr TimmArchitecture kTimmArchitectures[] = {\n")
    for name, section in rows:
        out.write('    {"%s", R"(%s)"},\n' % (name, section))
    out.write("};\n// clang-format on\n\n}  // namespace vit\n")


if __name__ == "__main__":
    main()
