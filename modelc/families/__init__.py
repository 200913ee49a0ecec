"""Model families as data: recognition, config, tensor mapping and LoRA slots.

:mod:`.contract` holds the :class:`~.contract.Family` contract and the helpers families
share, :mod:`.registry` the one list of families, and one module per family its
specifics.  Nothing here imports :mod:`modelc.runtime`: a family names its forward
class (``Family.runtime``, under ``modelc/runtime/arch/``), imported only when a model is
built, so :mod:`modelc.formats` reads and packs files without the runtime.
"""
