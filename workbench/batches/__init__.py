"""``workbench.batches``: OpenAI's Batch API and vLLM ``run-batch``'s file format over the engine.

An integration beside :mod:`workbench.serve` (which mounts its routes and supplies the backend that turns
request bodies into engine rows).  It holds what needs no HTTP and no engine of its own:

* :mod:`.store` — uploaded files, batch outputs and batch records on disk (they survive a restart);
* :mod:`.lines` — the line formats (OpenAI's input, output and error lines; vLLM's output line);
* :mod:`.runner` — the loop that answers requests as engine batches, chunk by chunk (the backend protocol);
* :mod:`.service` — the Batch API's lifecycle (validating → in_progress → finalizing → completed; cancel,
  expiry) and the thread that runs batches and picks unfinished ones up after a restart;
* :mod:`.cli` — ``python -m workbench batch -i requests.jsonl -o results.jsonl`` (resumable);
* :mod:`.routes` — the HTTP routes (``/v1/files``, ``/v1/batches``), FastAPI imported only there.
"""

from workbench.places import DATA_DIR_ENV

from .errors import BatchAPIError
from .lines import ENDPOINTS, LineError, Request, parse_line
from .runner import Answer, Backend, Interrupted, run_chunks, run_name
from .service import BatchService
from .store import BatchRecords, FileStore, default_data_dir

__all__ = [
    "DATA_DIR_ENV",
    "ENDPOINTS",
    "Answer",
    "Backend",
    "BatchAPIError",
    "BatchRecords",
    "BatchService",
    "FileStore",
    "Interrupted",
    "LineError",
    "Request",
    "default_data_dir",
    "parse_line",
    "run_chunks",
    "run_name",
]
