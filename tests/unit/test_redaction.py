"""The one redaction of secrets (redact.py): what it hides in a URL, what it leaves, and that a redacted value is
told apart so that no record's redacted value is ever used again."""

from __future__ import annotations

import json
import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from imagenet_train.config import Config
from imagenet_train.redact import MARK, SECRET_PARAMETERS, credentials, is_redacted, redact, redacted
from imagenet_train.rundir.trackers import flat_params, move_credentials

pytestmark = pytest.mark.unit

SECRET = "s3cr3t-VALUE"


@pytest.mark.parametrize(
    "url",
    [
        f"http://user:{SECRET}@host:8080/x-{{000000..000009}}.tar",
        f"https://{SECRET}@github.com/org/repo",  # a token as the user
        f"http://user:p@ss{SECRET}@host/x.tar",  # an unescaped '@' in the password
        f"https://bucket.s3.amazonaws.com/x.tar?X-Amz-Algorithm=AWS4&X-Amz-Credential={SECRET}&X-Amz-Signature=ab",
        f"https://bucket.s3.amazonaws.com/x.tar?x-amz-security-token={SECRET}",
        f"https://storage.googleapis.com/b/x.tar?X-Goog-Signature={SECRET}&X-Goog-Credential=a%2Fb",
        f"https://acct.blob.core.windows.net/c/x.tar?sv=2020&se=2030&sig={SECRET}",
        f"https://h/x.tar?TOKEN={SECRET}#part",
        f"https://h/x.tar?a=1&access_token={SECRET}",
        f"https://h/x.tar?key={SECRET}",
        f"https://h/x.tar?Password={SECRET}",
        f"https://h/x.tar?secret={SECRET}",
        f"pipe:curl -s 'https://h/x.tar?sig={SECRET}'",
        f"http://h/a.tar?sig={SECRET}::http://h/b.tar?sig={SECRET}",
        f"http://h/a.tar?x-id=Get::http://h/b.tar?X-Amz-Credential={SECRET}",  # a value ends at the next URL
        f"http://h/a.tar?next=http://h/b?token={SECRET}",
    ],
)
def test_a_urls_user_info_and_signed_query_values_are_replaced(url):
    shown = redact(url)
    assert SECRET not in shown and MARK in shown
    assert is_redacted(shown) and not is_redacted(url)
    assert redact(shown) == shown  # once is enough


@pytest.mark.parametrize(
    "text",
    [
        "",
        "runs/latest",
        "/data/shards/train-{000000..000146}.tar",
        "gs://bucket/prefix/run-1",
        "http://shards.internal/imagenet/shards.json",
        "https://h/x.tar?versionId=3&partNumber=2",  # query values that are not credentials
        "timm/resnet50d",
        "a=b and c@d",  # no URL
    ],
)
def test_text_without_secrets_is_left_as_it_is(text):
    assert redact(text) == text
    assert not is_redacted(text)


def test_the_redaction_list_is_lower_case_and_matched_in_any_case():
    assert all(name == name.casefold() for name in SECRET_PARAMETERS)
    assert redact(f"https://h/x?X-AMZ-SIGNATURE={SECRET}") == f"https://h/x?X-AMZ-SIGNATURE={MARK}"


def test_a_record_is_redacted_through_and_through():
    record = {"a": [f"http://u:{SECRET}@h/x", 3], "b": {"c": f"https://h/?sig={SECRET}"}, "d": True}
    assert SECRET not in json.dumps(redacted(record))
    assert redacted(record)["d"] is True and redacted(record)["a"][1] == 3


def test_config_json_checkpoints_and_tracker_params_hold_the_redacted_urls():
    cfg = Config()
    cfg.data.train_urls = f"http://u:{SECRET}@h/train-{{0..9}}.tar?sig={SECRET}"
    cfg.data.val_urls = f"https://h/val.tar?X-Goog-Signature={SECRET}"
    cfg.run.results = f"gs://bucket/run?token={SECRET}"
    text = cfg.to_json()  # config.json, every checkpoint's "config" and the tracker's params come from this
    assert SECRET not in text
    params = flat_params(json.loads(text))
    assert params["data.train_urls"] == f"http://{MARK}@h/train-{{0..9}}.tar?sig={MARK}"
    assert cfg.data.train_urls.startswith("http://u:")  # the run itself still reads the real URL


def test_the_tracking_uris_password_moves_to_mlflows_own_variables():
    environ = {"MLFLOW_TRACKING_URI": f"https://alice:{SECRET}%40x@mlflow.example:5000/base"}
    move_credentials(environ)
    assert environ == {
        "MLFLOW_TRACKING_URI": "https://mlflow.example:5000/base",
        "MLFLOW_TRACKING_USERNAME": "alice",
        "MLFLOW_TRACKING_PASSWORD": f"{SECRET}@x",
    }
    plain = {"MLFLOW_TRACKING_URI": "http://127.0.0.1:5000", "MLFLOW_TRACKING_PASSWORD": "given"}
    move_credentials(plain)
    assert plain == {"MLFLOW_TRACKING_URI": "http://127.0.0.1:5000", "MLFLOW_TRACKING_PASSWORD": "given"}
    assert credentials("file:///tmp/mlruns") == ("", "", "file:///tmp/mlruns")


_WORD = st.text(string.ascii_letters + string.digits + "-._~%", min_size=1, max_size=20)


@given(
    user=_WORD,
    password=_WORD,
    host=st.text(string.ascii_lowercase, min_size=1, max_size=10),
    secret=_WORD,
    name=st.sampled_from(sorted(SECRET_PARAMETERS)),
    case=st.sampled_from([str.lower, str.upper, str.title]),
    other=_WORD,
)
def test_no_secret_of_a_url_survives_and_the_rest_does(user, password, host, secret, name, case, other):
    url = f"https://{user}:{password}@{host}.example/path/x.tar?{case(name)}={secret}&keep={other}"
    shown = redact(url)
    assert shown == f"https://{MARK}@{host}.example/path/x.tar?{case(name)}={MARK}&keep={other}"
    assert is_redacted(shown)
    assert redact(f"in a log line: {url} failed") == f"in a log line: {shown} failed"
