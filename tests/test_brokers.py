import subprocess

import pytest

pytestmark = pytest.mark.integration


@pytest.mark.integration
def test_mosquitto_roundtrip(mosquitto):
    sub = subprocess.Popen(
        ["mosquitto_sub", "-p", str(mosquitto.port), "-t", "t/x", "-C", "1", "-W", "10"], stdout=subprocess.PIPE
    )
    import time

    time.sleep(0.3)
    subprocess.run(["mosquitto_pub", "-p", str(mosquitto.port), "-t", "t/x", "-m", "hello", "-q", "1"], check=True)
    assert sub.communicate(timeout=15)[0].strip() == b"hello"
