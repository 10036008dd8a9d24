"""DeepSeek-V2/V3 (MLA) model, config and Hugging Face folder I/O."""

from ..extras import require

require("runtime", "leyline_runtime.model")

from .config import MLAConfig, RopeScaling, UnsupportedConfig, config_from_dict
from .deepseek import CacheLayout, DeepseekForCausalLM
from .default import DEFAULT_MODEL_DIR, default_config, seeded_model
from .loader import load_model, read_config, save_model

__all__ = [
    "CacheLayout", "DEFAULT_MODEL_DIR", "DeepseekForCausalLM", "MLAConfig", "RopeScaling",
    "UnsupportedConfig", "config_from_dict", "default_config", "load_model", "read_config",
    "save_model", "seeded_model",
]
