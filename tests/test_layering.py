"""The private-modules rule of the import contracts (tools/import_contracts.py), on small graphs:
a package's ``_module`` is imported from inside the package only."""

import sys
from pathlib import Path

import grimp
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tools.import_contracts import PrivateModulesContract  # noqa: E402


def check(*imports: tuple[str, str]):
    graph = grimp.ImportGraph()
    for importer, imported in imports:
        graph.add_import(importer=importer, imported=imported)
    contract = PrivateModulesContract(name="private", session_options={}, contract_options={"root": "pkg"})
    return contract.check(graph, verbose=False)


def test_a_package_imports_its_own_private_modules():
    assert check(("pkg.launch", "pkg.launch._local"), ("pkg.launch._cluster", "pkg.launch._local")).kept


def test_the_root_packages_private_modules_are_shared_within_it():
    assert check(("pkg.launch._local", "pkg._errors"), ("pkg.tuning._tuner", "pkg._files")).kept


@pytest.mark.parametrize("importer", ["pkg.tuning._loop", "pkg.tuning", "pkg.launcher_extra", "other.module"], ids=str)
def test_another_package_importing_a_private_module_breaks_the_contract(importer):
    result = check((importer, "pkg.launch._local"))
    assert not result.kept and result.metadata["broken"] == [(importer, "pkg.launch._local")]


def test_dunder_modules_are_not_private():
    assert check(("pkg.cli", "pkg.probe.__main__")).kept
