"""A contract type for import-linter: a package's private modules are its own.

A module whose name starts with ``_`` (``zerotune.launch._local``) may be imported only from
inside its package (``zerotune.launch`` and its submodules); others import what the package
re-exports in its ``__init__``. The root package's private modules (``zerotune._errors``) are
therefore shared by every package of zerotune and by nothing outside it.
"""

from __future__ import annotations

from importlinter import Contract, ContractCheck, fields, output


class PrivateModulesContract(Contract):
    """Options: ``root``, the package whose modules are checked."""

    root = fields.StringField()

    def check(self, graph, verbose: bool) -> ContractCheck:
        root = str(self.root)
        broken = []
        for module in sorted(graph.modules):
            parent, _, name = module.rpartition(".")
            if not module.startswith(root) or not name.startswith("_") or name.startswith("__"):
                continue
            for importer in sorted(graph.find_modules_that_directly_import(module)):
                if importer != parent and not importer.startswith(parent + "."):
                    broken.append((importer, module))
        return ContractCheck(kept=not broken, metadata={"broken": broken})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for importer, module in check.metadata["broken"]:
            package = module.rpartition(".")[0]
            output.print_error(f"{importer} imports {module}: import it from {package} (its __init__ re-exports it)")
            output.new_line()
