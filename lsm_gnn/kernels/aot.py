"""Every Triton kernel compiled by Triton's real NVIDIA pipeline, with no GPU: the check the interpreter cannot make.

The interpreter runs the kernels' Python; a GPU first compiles them (source -> ttir -> ttgir -> llir -> ptx ->
cubin), and the compiler rejects what the interpreter accepts: a method call on a scalar argument that the
launcher turned into a constant (Triton specializes an integer argument equal to 1), a Python truth test on a
run-time value, a layout a pass cannot handle. Two steps, in two processes, because triton decides at its import
whether it interprets:

1. record (:mod:`lsm_gnn.testing.kernel_launches`, which drives the cache and the sampler from above them): run the
   project's own code (the cache under every policy, both PVP modes, a one-set cache, the
   sampler with int32 and int64 indices and several fanouts) on CPU tensors under the interpreter, and keep
   each kernel launch's arguments as the launcher sees them (tensor dtypes and alignment, integer values,
   constexprs, options).
2. ``compile``: with triton's compiler, turn each launch, and edge variants of it (each integer argument equal
   to 1, then past 2**31), into the signature, constants and attributes Triton's own launcher derives; compile
   each launch to cubin for each architecture and read registers and spills from the log of triton's own
   ``ptxas -v`` run, and each edge variant through triton's own stages only (EDGE_STAGE).

    python -m lsm_gnn.testing.kernel_launches launches.json
    python -m lsm_gnn.kernels.aot compile launches.json --arch 80,90 --json report.json

tests/test_kernels_compile.py runs both for sm_80 and sm_90 with every installed triton.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import io
import json
import os
import re
import sys
import tempfile
import time

#: Values an integer argument takes in the edge variants: 1 (the launcher makes it a constant) and past 2**31
#: (it becomes i64; divisible by 16, so it also carries the divisibility attribute).
EDGE_VALUES = (1, 2**31 + 16)

#: The last stage the edge variants compile through. Triton 3.6 and 3.9 list the same stages (their backends'
#: ``add_stages``: ttir, ttgir, llir, ptx, cubin). An edge value enters as a constant, an i64 or a divisibility
#: attribute; the front end (ttir) folds or types it, ttgir picks layouts and vector widths from it (a stride of 1
#: or a width divisible by 16 gave layouts the recorded launch lacked), and llir is triton's own lowering of those
#: layouts: the last stage whose code sees them. ptx and cubin are LLVM's NVPTX back end and ptxas on plain LLVM IR
#: (with ``ptxas -v``, 40-45% of an edge variant's time), and registers at made-up values judge nothing: the
#: recorded launches' do.
EDGE_STAGE = "llir"


# ---------------------------------------------------------------------------------------------------------------
# Step 1: record the launches (interpreter)
# ---------------------------------------------------------------------------------------------------------------

def _describe(value):
    """An argument as the launcher specializes it, in JSON."""
    if hasattr(value, "data_ptr") and hasattr(value, "dtype"):
        return {"tensor": str(value.dtype).removeprefix("torch."), "aligned": value.data_ptr() % 16 == 0}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if type(value).__name__ == "constexpr":
        return _describe(value.value)
    raise TypeError(f"cannot record a kernel argument of type {type(value).__name__}")


class LaunchRecorder:
    """Context manager: while active, every launch of a kernel of ``lsm_gnn.kernels`` is kept (deduplicated)."""

    def __init__(self):
        self.launches: dict[str, dict] = {}

    def __enter__(self):
        from triton.runtime.interpreter import InterpretedFunction

        self._class = InterpretedFunction
        self._run = run = InterpretedFunction.run
        launches = self.launches

        def recording_run(fn, *args, grid, warmup, **kwargs):
            if fn.fn.__module__.startswith("lsm_gnn.kernels."):
                launch = {"kernel": f"{fn.fn.__module__}:{fn.fn.__name__}",
                          "args": [_describe(a) for a in args],
                          "kwargs": {k: _describe(v) for k, v in sorted(kwargs.items())}}
                launches.setdefault(json.dumps(launch, sort_keys=True), launch)
            return run(fn, *args, grid=grid, warmup=warmup, **kwargs)

        InterpretedFunction.run = recording_run
        return self

    def __exit__(self, *exc):
        self._class.run = self._run
        return False


# ---------------------------------------------------------------------------------------------------------------
# Step 2: compile them (compiler)
# ---------------------------------------------------------------------------------------------------------------

def _kernel(name: str, overrides: dict[str, str]):
    """The JITFunction ``module:function``; ``overrides`` maps a module name to a file loaded in its place."""
    module_name, function = name.split(":")
    if module_name in overrides and module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_name, overrides[module_name])
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    return getattr(importlib.import_module(module_name), function)


def _argument(description):
    """A stand-in for a recorded argument that the launcher specializes the same way."""
    import torch

    if isinstance(description, dict) and "tensor" in description:
        dtype = getattr(torch, description["tensor"])
        base = torch.empty(4, dtype=dtype)
        return base if description["aligned"] else base[1:]  # one element in: 1 to 8 bytes off 16
    return description


def _shape(launch: dict) -> str:
    """What a launch's compiled code depends on besides the values of its integer arguments."""
    kinds = [a if isinstance(a, dict) or a is None else type(a).__name__ for a in launch["args"]]
    return json.dumps([launch["kernel"], launch["kwargs"], kinds], sort_keys=True)


def edge_variants(launches: list[dict], only=None, overrides=None) -> list[tuple[str, dict]]:
    """For one launch of each shape (kernel, constexprs, tensor dtypes and alignment): each plain integer
    argument (of those named in ``only``, if given) set to each of EDGE_VALUES, the others as recorded."""
    bases = {}
    for launch in launches:
        bases.setdefault(_shape(launch), launch)
    out = []
    for launch in bases.values():
        names = list(_kernel(launch["kernel"], overrides or {}).arg_names) if only else None
        for i, value in enumerate(launch["args"]):
            if only and names[i] not in only:
                continue
            if isinstance(value, int) and not isinstance(value, bool):
                for edge in EDGE_VALUES:
                    if value != edge:
                        args = list(launch["args"])
                        args[i] = edge
                        out.append((f"arg {i} = {edge}", dict(launch, args=args)))
    return out


class Compiler:
    """Compiles launches for one architecture exactly as Triton's launcher would specialize them."""

    def __init__(self, arch: int, overrides: dict[str, str] | None = None):
        from triton.backends.compiler import GPUTarget
        from triton.compiler import make_backend

        self.arch = arch
        self.target = GPUTarget("cuda", arch, 32)
        self.backend = make_backend(self.target)
        self.overrides = overrides or {}
        self._binders = {}

    def specialize(self, launch: dict):
        """(fn, signature, constexprs, attrs, options, key) by the launcher's own binder."""
        from triton.runtime.jit import create_function_from_signature

        fn = _kernel(launch["kernel"], self.overrides)
        if fn not in self._binders:
            self._binders[fn] = create_function_from_signature(fn.signature, fn.params, self.backend)
        args = [_argument(a) for a in launch["args"]]
        kwargs = {k: _argument(v) for k, v in launch["kwargs"].items()}
        bound, specialization, options = self._binders[fn](*args, **kwargs)
        options, signature, constexprs, attrs = fn._pack_args(self.backend, kwargs, bound, specialization, options)
        key = repr((launch["kernel"], sorted(signature.items()), sorted(constexprs.items(), key=repr),
                    sorted(attrs.items(), key=repr), sorted(options.__dict__.items(), key=repr)))
        return fn, signature, constexprs, attrs, options, key

    def compile(self, fn, signature, constexprs, attrs, options, through: str = "cubin") -> dict:
        """Compiles to cubin and returns registers, spills and the cubin's size; or, ``through`` an earlier stage,
        only checks that triton's stages up to it accept the kernel. Either way the stage it went through, or the
        error."""
        import triton
        from triton.compiler import ASTSource

        start = time.perf_counter()
        source = ASTSource(fn, signature, constexprs, attrs)
        log = io.StringIO()
        try:
            if through == "cubin":
                with _ptxas_log_to(log):
                    kernel = triton.compile(source, target=self.target, options=options.__dict__)
            else:
                self._run_stages(source, options, through)
        except Exception as exc:  # noqa: BLE001  (every compiler failure is a finding, reported as text)
            return {"error": _short_error(exc), "stage": through, "seconds": time.perf_counter() - start}
        if through != "cubin":
            return {"stage": through, "seconds": time.perf_counter() - start}
        usage = ptxas_usage(log.getvalue())
        return dict(usage, stage="cubin", seconds=time.perf_counter() - start, cubin_bytes=len(kernel.asm["cubin"]))

    def _run_stages(self, source, options, last: str) -> None:
        """triton.compile's own pipeline (make_ir, then the backend's stage list in order) up to and including
        ``last``, without its cache and without the stages after ``last``."""
        import triton
        from triton._C.libtriton import ir

        options = self.backend.parse_options(dict(options.__dict__, **source.parse_options()))
        stages = {}
        self.backend.add_stages(stages, options, source.language)
        if last not in stages:
            raise ValueError(f"triton {triton.__version__} has no stage {last!r}; its stages: {', '.join(stages)}")
        context = ir.context()
        ir.load_dialects(context)
        self.backend.load_dialects(context)
        module = source.make_ir(self.target, options, self.backend.get_codegen_implementation(options),
                                self.backend.get_module_map(), context)
        metadata = {"target": self.target, **options.__dict__}  # what the stages read and add to
        for name, stage in stages.items():
            module = stage(module, metadata)
            if name == last:
                return


def _short_error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    lines = [line for line in text.splitlines() if line.strip()]
    # Triton's MLIR failures print the whole module; the first lines and the 'error:' lines say what failed.
    errors = [line for line in lines if "error:" in line]
    return "\n".join(lines[:12] + errors[:4])[:3000]


@contextlib.contextmanager
def _ptxas_log_to(stream):
    """While active, triton compiles every kernel afresh (never from its cache) and prints the log of its own
    ``ptxas -v`` run into ``stream``: the registers and spills of the cubin it built, with its own flags
    (``-lineinfo``, and ``--regAllocOptLevel=2`` in 3.9), and no second ptxas run."""
    from triton import knobs

    saved = knobs.compilation.always_compile, knobs.nvidia.dump_ptxas_log
    knobs.compilation.always_compile, knobs.nvidia.dump_ptxas_log = True, True
    try:
        with contextlib.redirect_stdout(stream):
            yield
    finally:
        knobs.compilation.always_compile, knobs.nvidia.dump_ptxas_log = saved


def ptxas_usage(log: str) -> dict:
    """Registers, spill bytes and stack frame of the one kernel a ``ptxas -v`` log reports."""
    if not re.search(r"Used \d+ registers", log):
        return {"error": "ptxas: its log names no register count:\n" + log[-2000:]}

    def number(pattern):
        found = re.search(pattern, log)
        return int(found.group(1)) if found else 0

    return {"registers": number(r"Used (\d+) registers"), "spill_stores": number(r"(\d+) bytes spill stores"),
            "spill_loads": number(r"(\d+) bytes spill loads"), "stack": number(r"(\d+) bytes stack frame")}


_worker_compilers: dict = {}


def _compile_in_worker(arch: int, overrides: dict, case: dict, through: str) -> dict:
    compiler = _worker_compilers.get(arch) or _worker_compilers.setdefault(arch, Compiler(arch, overrides))
    # MLIR writes its diagnostics (the failing op and pass) to file descriptor 2: keep them with the result.
    with tempfile.TemporaryFile("w+") as diagnostics:
        saved = os.dup(2)
        os.dup2(diagnostics.fileno(), 2)
        try:
            outcome = compiler.compile(*compiler.specialize(case)[:5], through=through)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        diagnostics.seek(0)
        errors = [line for line in diagnostics.read().splitlines() if "error:" in line]
    if "error" in outcome and errors:
        outcome["error"] += "\n" + "\n".join(errors[:4])
    return outcome


def compile_all(launches: list[dict], archs, overrides=None, edge_archs=(90,), jobs: int = 0, log=print,
                edge_args=None) -> list[dict]:
    """Compiles every distinct specialization of ``launches`` to cubin for each of ``archs``, and their edge
    variants through EDGE_STAGE for each of ``edge_archs`` (the front end's failures do not depend on the arch),
    in ``jobs`` processes."""
    import concurrent.futures
    import multiprocessing

    work, seen = [], set()
    for arch in archs:
        compiler = Compiler(int(arch), overrides)
        cases = [("recorded", launch) for launch in launches]
        if int(arch) in {int(a) for a in edge_archs}:
            cases += edge_variants(launches, edge_args, overrides)
        for variant, case in cases:
            fn, signature, constexprs, attrs, options, key = compiler.specialize(case)
            if (arch, key) not in seen:
                seen.add((arch, key))
                through = "cubin" if variant == "recorded" else EDGE_STAGE
                work.append((int(arch), variant, through, case, signature, options.num_warps,
                             {case_key: value for case_key, value in case["kwargs"].items() if case_key.isupper()}))
    jobs = jobs or os.cpu_count() or 1
    log(f"{len(work)} distinct specializations, {jobs} compiler processes")
    results = []
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(_compile_in_worker, arch, overrides or {}, case, through)
                   for arch, _, through, case, *_ in work]
        for (arch, variant, _, case, signature, num_warps, blocks), future in zip(work, futures):
            row = dict(future.result(), arch=arch, kernel=case["kernel"], variant=variant, num_warps=num_warps,
                       blocks=blocks, signature={k: v for k, v in signature.items() if v != "constexpr"})
            results.append(row)
            log(_report_line(row))
    return results


def _report_line(row: dict) -> str:
    blocks = " ".join(f"{k}={v}" for k, v in row["blocks"].items())
    where = (f"sm_{row['arch']} {row['kernel'].split(':')[1]:<18} {row['variant']:<20} {blocks:<20} "
             f"warps {row['num_warps']}")
    if "error" in row:
        return f"FAIL {where}: {row['error'].splitlines()[0][:160]}"
    if row["stage"] != "cubin":
        return f"ok   {where} through {row['stage']} ({row['seconds']:.1f} s)"
    return (f"ok   {where} regs {row['registers']:>3} spills {row['spill_stores']}/{row['spill_loads']} "
            f"stack {row['stack']} ({row['seconds']:.1f} s)")


def write_json(path: str, obj) -> None:
    from lsm_gnn.utils.fileio import atomic_write_bytes

    atomic_write_bytes(json.dumps(obj, indent=1).encode(), path)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="step", required=True)
    c = sub.add_parser("compile", help="compile recorded launches for GPU architectures (no GPU needed)")
    c.add_argument("launches")
    c.add_argument("--arch", default="80,90", help="compute capabilities, e.g. 80,90")
    c.add_argument("--json", help="write every compile's outcome here")
    c.add_argument("--edge-arch", default="90",
                   help=f"archs that also compile the edge variants, through {EDGE_STAGE} only: no PTX, cubin or "
                        "registers ('' for none)")
    c.add_argument("--jobs", type=int, default=0, help="compiler processes (default: one per core)")
    c.add_argument("--edge-args", help="vary only these arguments (comma-separated names) in the edge variants")
    c.add_argument("--override", action="append", default=[], metavar="MODULE=FILE",
                   help="load FILE as MODULE (a changed copy of a kernel module)")
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise SystemExit("aot compile: unset TRITON_INTERPRET (the interpreter compiles nothing)")
    os.environ["TRITON_INTERPRET"] = "0"  # keep lsm_gnn from choosing the interpreter on a machine without a GPU
    bad = [o for o in args.override if "=" not in o or not os.path.isfile(o.split("=", 1)[1])]
    if bad:
        p.error(f"--override {bad[0]!r}: give MODULE=FILE with an existing file, e.g. "
                "lsm_gnn.kernels.sampler=/tmp/sampler.py")
    overrides = dict(o.split("=", 1) for o in args.override)
    with open(args.launches) as fh:
        launches = json.load(fh)["launches"]
    import triton

    print(f"triton {triton.__version__}: compiling {len(launches)} recorded launches for sm_{args.arch}")
    results = compile_all(launches, args.arch.split(","), overrides,
                          edge_archs=[a for a in args.edge_arch.split(",") if a], jobs=args.jobs,
                          edge_args=args.edge_args.split(",") if args.edge_args else None)
    failures = [r for r in results if "error" in r]
    if args.json:
        write_json(args.json, {"triton": triton.__version__, "results": results})
    print(f"{len(results)} compiles, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
