"""Where architectures come from: the bundled presets and recipes (`presets/`), a Hugging Face
config.json mapped family by family (`hf_config`, `hf_families`), the Hub client (`hub`), and a JSON
config read into a `spec.config.Config` with its model resolved (`loading`). Imports `spec` only.
"""
