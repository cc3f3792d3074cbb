"""The two folder checks: io/owned.py's owned_folder (a path this process names, a link of ours followed) and
io/atomic.py's own_folder (a descriptor, no link followed). They judge a folder alike and refuse it alike."""

import os

import pytest

from imagenet_train.errors import ImagenetTrainError
from imagenet_train.io.atomic import own_folder
from imagenet_train.io.owned import owned_folder
from tests.conftest import refusal


@pytest.mark.unit
def test_a_folder_others_may_write_to_is_refused_by_both_checks_in_the_same_words(tmp_path):
    folder = tmp_path / "report"
    folder.mkdir()
    folder.chmod(0o777)
    by_descriptor = refusal(lambda: own_folder(folder, "report:"))
    by_path = refusal(lambda: owned_folder(folder, f"report: {folder}", "another user could put links in it"))
    assert by_descriptor == by_path
    assert by_descriptor.startswith(f"report: {folder}: mode drwxrwxrwx; expected a directory of this user")


@pytest.mark.unit
def test_a_link_this_user_made_is_followed_by_the_path_check_and_refused_by_the_descriptor_check(tmp_path):
    target = tmp_path / "target"
    target.mkdir(mode=0o700)
    link = tmp_path / "report"
    link.symlink_to(target)
    assert owned_folder(link) == link
    with pytest.raises(ImagenetTrainError, match="a link, not followed"):
        own_folder(link, "report:")


@pytest.mark.unit
def test_each_check_makes_an_absent_folder_with_its_own_mode(tmp_path):
    old = os.umask(0o022)
    try:
        owned_folder(tmp_path / "by-path")
        os.close(own_folder(tmp_path / "by-descriptor", "report:"))
    finally:
        os.umask(old)
    assert (tmp_path / "by-path").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "by-descriptor").stat().st_mode & 0o777 == 0o755
