"""Stand-in modules for the CUDA-only and optional packages SGLang imports at module level.

Nothing recorded runs their code: the resolution pipeline and the pool sizing are pure Python over
torch dtypes. A stand-in module answers any attribute with a class that accepts any arguments, returns
a decorated function unchanged, iterates as empty and contains nothing.
"""

import importlib.abc
import importlib.machinery
import sys
import types

class _Meta(type):
    def __call__(cls, *a, **k):
        if len(a) == 1 and not k and (callable(a[0])) :
            return a[0]
        return super().__call__(*a, **k)
    def __getattr__(cls, n):
        if n.startswith("__"):
            raise AttributeError(n)
        return _Meta(n, (_Any,), {})
    def __iter__(cls): return iter(())
    def __contains__(cls, k): return False
    def __len__(cls): return 0
    def __or__(cls, o): return cls
    def __ror__(cls, o): return cls
    def __getitem__(cls, k): return cls

class _Any(metaclass=_Meta):
    def __init__(self, *a, **k): pass
    def __call__(self, *a, **k):
        if len(a) == 1 and not k and callable(a[0]):
            return a[0]
        return _Any()
    def __getattr__(self, n):
        if n.startswith("__"):
            raise AttributeError(n)
        return _Any()
    def __iter__(self): return iter(())
    def __contains__(self, k): return False
    def __len__(self): return 0
    def __getitem__(self, k): return _Any()

class _StubModule(types.ModuleType):
    def __getattr__(self, n):
        if n.startswith("__"):
            raise AttributeError(n)
        return _Meta(n, (_Any,), {})

class Stub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, names): self.names = set(names)
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in self.names:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
    def create_module(self, spec):
        m = _StubModule(spec.name); m.__path__ = []; m.__spec__ = spec; return m
    def exec_module(self, m): pass


# Not installed here (sglang 0.5.23's requirements, or what they bring): CUDA kernels, serving front-ends,
# media decoders
MISSING = ("torchvision", "triton", "sgl_kernel", "sglang_kernel", "flashinfer", "vllm", "cuda", "xgrammar",
           "outlines", "llguidance", "decord", "decord2", "fastapi", "uvloop", "setproctitle", "partial_json_parser",
           "openai", "openai_harmony", "anthropic", "tiktoken", "sentencepiece", "compressed_tensors", "interegular",
           "blobfile", "tvm_ffi", "gguf", "av", "deepseek_recipe", "easydict", "flash_attn", "humming_kernels",
           "mistral_common", "modelscope", "numba", "cutlass", "pynvml", "prometheus_client", "quack", "sgl_deep_ep",
           "deep_ep", "deep_gemm", "sgl_deep_gemm", "flash_mla", "sgl_flash_mla", "soundfile", "tilelang",
           "torch_memory_saver", "torchaudio", "torchcodec", "watchfiles", "zstandard", "smg_grpc_servicer",
           "tml_renderers", "nvshmem4py", "nvidia_mathdx")


def install() -> None:
    """Import transformers' model code first (its availability probes must see what is really installed),
    then put the stand-ins before every other finder."""
    import transformers.utils.import_utils as probes
    probes.is_torchvision_available()
    import transformers.modeling_utils  # noqa: F401
    import transformers.models.llama.modeling_llama  # noqa: F401
    sys.meta_path.insert(0, Stub(MISSING))
