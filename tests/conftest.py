"""What every test shares: the repository, the `afm` command, the environment of the processes tests start (one thread,
no progress bars), and the tiny models (built or fitted in seconds, the fitted one cached by `afm.models.fit`)."""
import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
REPO = Path(__file__).resolve().parents[1]
AFM = str(Path(sys.executable).with_name("afm"))  # the console script of the environment that runs the tests
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}  # for a process a test starts
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def tool_caller_folder() -> Path:
    "The tool-calling tiny model's folder (`afm.models.fit.tool_calling_tiny`: fitted once, cached); tests read it."
    from afm.models.fit import tool_calling_tiny
    return Path(tool_calling_tiny()[0].name_or_path)


@pytest.fixture(scope="session")
def tiny_chat_folder(tmp_path_factory) -> Path:
    """An untrained tiny chat model (`afm.models.catalog.tiny_chat_model`) saved in a folder of the session's own;
    tests only
    read it."""
    from afm.models.catalog import save_model, tiny_chat_model
    return save_model(*tiny_chat_model(), tmp_path_factory.mktemp("tiny") / "model")
