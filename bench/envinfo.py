"""Facts recorded beside the numbers: date, GPU, versions, git commit. torch is imported inside."""
import datetime
import os
import platform
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def git_commit(repo=REPO):
    """Short commit hash, '+dirty' when the work tree has changes; 'unknown' outside git or before a commit."""
    try:
        sha = subprocess.run(["git", "-C", repo, "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        if sha.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "-C", repo, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
        return sha.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def collect(argv=None):
    import torch
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "none",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": str(torch.backends.cudnn.version()) if torch.backends.cudnn.is_available() else None,
        "python": platform.python_version(),
        "commit": git_commit(),
        "command": " ".join(["python bench/run.py", *(sys.argv[1:] if argv is None else argv)]),
    }
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        info["capability"] = f"sm_{major}{minor}"
    try:
        import flashcute
        info["flashcute"] = flashcute.version()
    except Exception as e:  # noqa: BLE001 - the bench then reports flashcute as n/a; it does not stop
        info["flashcute"] = f"unavailable ({e})"
    return info
