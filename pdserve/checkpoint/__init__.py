"""Reading a checkpoint without running it: where the model is (`source.py`, `embedded.py`), its
configuration (`model_config.py`, from `hf_config.py` or `gguf_config.py`), the GGUF container
(`gguf_file.py`) and its blocks as float32 (`gguf_dequant.py`). Pure Python and numpy: the router,
the CLI's checks and the deploy sizing import it without torch; pdserve/model/ builds on it."""
