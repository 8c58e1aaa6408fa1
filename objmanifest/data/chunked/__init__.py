"""Chunked entries: multipart uploads that outlive their producer, verified part by part.

* ``state``: the upload-state object (model, codec, pure named changes);
* ``engine`` and ``pump``: sending an upload, adopting an earlier holder's, completing it;
* ``download``: reading a chunked entry with parallel verified ranged GETs;
* ``cleanup``: aborting what nobody will finish, marking data nobody may adopt back.

Built on the store, the CAS loop and a ``Scope`` (the task as uploads see it), never on
``Task``.
"""

from .cleanup import abandon, adoptable, reject_data, sweep, sweep_plan
from .download import download, load_parts
from .engine import upload
from .pump import UploadStats
from .scope import Scope
from .state import Part, UploadCodec, UploadState

__all__ = [
    "Part",
    "Scope",
    "UploadCodec",
    "UploadState",
    "UploadStats",
    "abandon",
    "adoptable",
    "download",
    "load_parts",
    "reject_data",
    "sweep",
    "sweep_plan",
    "upload",
]
