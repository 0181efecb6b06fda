"""The package's layout shows its architecture (issue 44): a short root, each layer a package, and no module name at
two levels (a root ``hashing.py`` beside ``cache/hashing.py`` leaves a reader guessing which one a name means)."""
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "lsm_gnn"
MAX_ROOT_MODULES = 12


def test_the_package_root_holds_at_most_12_modules():
    root = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(root) <= MAX_ROOT_MODULES, (
        f"lsm_gnn/ holds {len(root)} modules ({', '.join(root)}), more than {MAX_ROOT_MODULES}: put the new one in "
        "the package of its layer (utils/, training/, tasks/, cli/, testing/ for test and benchmark helpers, ...)")


def test_no_root_module_shares_its_name_with_a_module_or_package_below():
    root = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__", "__main__"}
    below = {p.relative_to(PACKAGE).as_posix(): p.stem for p in PACKAGE.glob("*/**/*.py")}
    below.update({p.name + "/": p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()})
    split = sorted(f"lsm_gnn/{name}.py and lsm_gnn/{path}" for path, name in below.items() if name in root)
    assert not split, f"a name split across levels: {'; '.join(split)}"
