"""Dataset recipes for WER runs, and the draft-distillation recipe.

`DATASETS` maps a dataset name to its `Recipe`: `recipe.load(data_dir)` gives the sorted
`Utterance`s, `recipe.download(cache_dir)` (where there is one) fetches the data.
`datasets` reads Hugging Face datasets (save_to_disk, parquet, hub ids; extra `specasr[datasets]`).
"""

from specasr.recipes.base import DatasetError, DownloadError, Recipe, Utterance
from specasr.recipes.commonvoice import RECIPES as _CV
from specasr.recipes.hf_datasets import RECIPES as _HF
from specasr.recipes.librispeech import RECIPES as _LS
from specasr.recipes.manifest import RECIPES as _MANIFEST
from specasr.recipes.tedlium import RECIPES as _TED

DATASETS: dict[str, Recipe] = {**_LS, **_TED, **_CV, **_MANIFEST, **_HF}

__all__ = ["DATASETS", "DatasetError", "DownloadError", "Recipe", "Utterance"]
