"""check_home: an unusable KOPE_HOME is refused in one line naming what is wrong; a usable one is made 0700."""

from __future__ import annotations

import os
import stat

import pytest

from kope_mcp.errors import HomeUnusableError
from kope_mcp.settings import check_home


def test_a_home_under_a_file_names_the_file(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(HomeUnusableError, match=r"^home_unusable: KOPE_HOME .* cannot be made: .*/f is a file"):
        check_home(tmp_path / "f" / "a" / "b")


def test_a_home_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "home").write_text("x")
    with pytest.raises(HomeUnusableError, match="is a file, not a folder"):
        check_home(tmp_path / "home")


def test_a_missing_home_is_made_private_or_only_judged(tmp_path):
    check_home(tmp_path / "judged" / "home", create=False)
    assert not (tmp_path / "judged").exists()
    check_home(tmp_path / "made" / "home")
    assert stat.S_IMODE((tmp_path / "made" / "home").stat().st_mode) == 0o700


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_a_home_this_user_cannot_write_is_refused(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        with pytest.raises(HomeUnusableError, match=r"not writable|permission denied"):
            check_home(locked)
        with pytest.raises(HomeUnusableError, match="cannot be made"):
            check_home(locked / "home")
    finally:
        locked.chmod(0o700)
