"""Running the command line in-process, shared by the CLI tests."""

import contextlib
import io
import json

from diffpipe import cli


def run(argv):
    """``(exit code, stdout, stderr)`` of ``diffpipe ARGV`` run in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def hf_config(tmp_path, config):
    """``config`` written as ``tmp_path/config.json`` (a Hugging Face config), its path."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path
