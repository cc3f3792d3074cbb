"""The shard index: brace notation, loading from paths and URLs, and errors for bad indexes."""

import pytest

from imagenet_train.datasets.source import brace, load_index
from imagenet_train.errors import ImagenetTrainError


def test_brace_notation_compresses_consecutive_shards():
    names = [f"x-train-{i:06d}.tar" for i in range(13)] + ["x-train-000020.tar", "extra.tar"]
    assert brace(names) == ["x-train-{000000..000012}.tar", "x-train-000020.tar", "extra.tar"]


def test_index_urls_resolve_against_where_it_was_read(shard_server, digit_shards):
    local = load_index(str(digit_shards))
    remote = load_index(shard_server.url)
    assert local.urls("train")[0] == str(digit_shards / local.shards("train")[0]["url"])
    assert remote.urls("train")[0] == f"{shard_server.url}/{local.shards('train')[0]['url']}"
    assert remote.nsamples("train") == 1438 and len(remote.classes) == 10


@pytest.mark.parametrize(
    ("content", "message"),
    [("{not json", "not a JSON shard index"), ('{"shardlist": []}', "expected an imagenet-train index")],
)
def test_bad_index_files_are_named_in_the_error(tmp_path, content, message):
    (tmp_path / "shards.json").write_text(content)
    with pytest.raises(ImagenetTrainError, match=message) as caught:
        load_index(str(tmp_path))
    assert str(tmp_path / "shards.json") in str(caught.value)


def test_missing_index_and_missing_split(tmp_path, digit_shards):
    with pytest.raises(ImagenetTrainError, match="no shard index here"):
        load_index(str(tmp_path))
    with pytest.raises(ImagenetTrainError, match="no split 'test'"):
        load_index(str(digit_shards)).urls("test")
