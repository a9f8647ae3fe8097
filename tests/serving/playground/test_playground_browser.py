"""The playground page in a real browser: Debian's headless Chromium driven by Selenium against
a real server on 127.0.0.1. An attached image is encoded while the person types (the chip reads
"cached"), so two turns about it both report it cached and the chat encodes nothing; a handle
the server lost is answered by resending the bytes; the cache panel fills in; with and without
an API key; user text stays text; a video uploaded to a video model is encoded piece by piece,
then cached.

Skipped when Chromium or chromedriver is missing, unless ``MMSERVE_REQUIRE_BROWSER=1`` (CI
sets it: there a missing browser is a failure). Screenshots go to ``$MMSERVE_TEST_ARTIFACTS``
(default ``test-artifacts/`` in the repository).
"""

from __future__ import annotations

import base64
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from mmserve.entrypoints.openai.server import RunningServer
from tests.support.images import make_image
from tests.support.video import make_video

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
REQUIRED = os.environ.get("MMSERVE_REQUIRE_BROWSER") == "1"
if not (CHROMIUM and CHROMEDRIVER) and not REQUIRED:
    pytest.skip("needs chromium and chromedriver (Debian packages)", allow_module_level=True)

KEY = "browser-key"
ARTIFACTS = Path(
    os.environ.get("MMSERVE_TEST_ARTIFACTS", Path(__file__).parents[3] / "test-artifacts")
)
CACHED = {"prefix_cache", "encoder_cache", "encoder_store"}


@pytest.fixture(scope="module")
def open_server(serve_model) -> Iterator[RunningServer]:
    with serve_model("tiny-llava", "--host", "127.0.0.1") as srv:
        yield srv


@pytest.fixture(scope="module")
def keyed_server(serve_model) -> Iterator[RunningServer]:
    with serve_model("tiny-llava", "--host", "127.0.0.1", "--api-key", KEY) as srv:
        yield srv


@pytest.fixture(scope="module")
def video_server(serve_model) -> Iterator[RunningServer]:
    # its template has videos
    with serve_model("tiny-qwen2-vl-hub", "--host", "127.0.0.1") as srv:
        yield srv


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.fail("MMSERVE_REQUIRE_BROWSER=1 but chromium / chromedriver are missing")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(flag)
    options.add_argument("--window-size=1280,900")
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(CHROMEDRIVER))
    driver.set_script_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def image_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("page") / "shapes.png"
    make_image(3, (160, 120)).save(path)
    return path


@pytest.fixture(scope="module")
def video_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("page") / "counter.mp4"
    path.write_bytes(make_video(num_frames=16, fps=4, size=(64, 48)))
    return path


def open_page(driver: webdriver.Chrome, server: RunningServer) -> None:
    driver.get(f"{server.url}/")
    wait(driver).until(lambda d: d.execute_script("return document.getElementById('model').value"))
    driver.find_element(By.ID, "max-tokens").clear()
    driver.find_element(By.ID, "max-tokens").send_keys("6")


def wait(driver: webdriver.Chrome, seconds: float = 60) -> WebDriverWait:
    return WebDriverWait(driver, seconds)


def send(driver: webdriver.Chrome, text: str) -> dict:
    """Type ``text``, press Send, wait for the reply; the reply turn's text and stats."""
    before = len(driver.find_elements(By.CSS_SELECTOR, ".turn.assistant[data-done]"))
    driver.find_element(By.ID, "prompt").send_keys(text)
    driver.find_element(By.ID, "send").click()
    wait(driver).until(
        lambda d: len(d.find_elements(By.CSS_SELECTOR, ".turn.assistant[data-done]")) > before
    )
    turn = driver.find_elements(By.CSS_SELECTOR, ".turn.assistant")[-1]
    stats = {
        s.get_attribute("data-stat"): s.text for s in turn.find_elements(By.CSS_SELECTOR, ".stat")
    }
    media = turn.find_elements(By.CSS_SELECTOR, ".media-item")
    sources = [m.get_attribute("data-source") for m in media]
    error = "error" in (turn.get_attribute("class") or "")
    return {"text": turn.find_element(By.CSS_SELECTOR, ".text").text, "stats": stats,
            "sources": sources, "media": [m.text for m in media], "error": error}  # fmt: skip


def panel(driver: webdriver.Chrome) -> dict[str, str]:
    cells = driver.find_elements(By.CSS_SELECTOR, "#metrics [data-metric]")
    return {c.get_attribute("data-metric"): c.text for c in cells}


def drop_or_paste(driver: webdriver.Chrome, path: Path, event: str) -> None:
    """A synthetic drop / paste of ``path`` as a File (what the OS would hand the page)."""
    data = base64.b64encode(path.read_bytes()).decode()
    driver.execute_script(
        """
        const [data, name, kind] = arguments;
        const bytes = Uint8Array.from(atob(data), (c) => c.charCodeAt(0));
        const transfer = new DataTransfer();
        transfer.items.add(new File([bytes], name, { type: "image/png" }));
        const init = { bubbles: true, cancelable: true };
        const event = kind === "drop"
          ? new DragEvent("drop", { ...init, dataTransfer: transfer })
          : new ClipboardEvent("paste", { ...init, clipboardData: transfer });
        document.getElementById(kind === "drop" ? "log" : "prompt").dispatchEvent(event);
        """,
        data,
        path.name,
        event,
    )
    wait(driver, 10).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#attachments .chip"))


def encoded(server: RunningServer) -> float:
    return server.engine.get_metrics()["encoder_images_encoded"]


def attach_and_wait_cached(driver: webdriver.Chrome, path: Path) -> None:
    """Attach ``path`` and wait until its chip says it was encoded ahead."""
    driver.find_element(By.ID, "file-input").send_keys(str(path))
    chip = "#attachments .chip[data-state='cached']"
    wait(driver, 30).until(lambda d: d.find_elements(By.CSS_SELECTOR, chip))
    assert driver.find_element(By.CSS_SELECTOR, f"{chip} .state").text == "cached"


def test_two_turns_about_an_image_encoded_ahead(browser, open_server, image_file) -> None:
    open_page(browser, open_server)
    assert not browser.find_element(By.ID, "key-field").is_displayed()
    before = encoded(open_server)
    attach_and_wait_cached(browser, image_file)
    assert encoded(open_server) - before == 1  # while "typing"
    first = send(browser, "What is in this image?")
    assert not first["error"], first["text"]
    assert first["sources"] == ["encoder_cache"] and first["media"][0].startswith("image 1: cached")
    assert encoded(open_server) - before == 1  # the turn sent the handle: nothing encoded
    # tokens/s needs a measurable span between the first token and the end (6 tokens here)
    assert {"prompt_tokens", "cached_tokens", "ttft"} <= set(first["stats"])
    assert first["stats"]["cached_tokens"] == "cached 0"
    second = send(browser, "And what colors does it have?")
    assert not second["error"], second["text"]
    assert len(second["sources"]) == 1 and second["sources"][0] in CACHED
    assert int(second["stats"]["cached_tokens"].split()[-1]) > 0
    wait(browser, 10).until(lambda d: panel(d)["queue"] == "0 / 0")
    values = panel(browser)
    assert values["images_encoded"] == "1" and values["embeddings_saved"] != "-"
    assert values["encoder_hit_rate"] != "-" and values["prefix_hit_rate"] != "-"
    assert values["kv_usage"].endswith("%")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(ARTIFACTS / "playground-two-turns.png"))


def test_with_an_api_key_pasted_and_dropped_images(browser, keyed_server, image_file) -> None:
    browser.get(f"{keyed_server.url}/")
    wait(browser, 10).until(lambda d: d.find_element(By.ID, "key-field").is_displayed())
    assert "needs an API key" in browser.find_element(By.ID, "notice").text
    field = browser.find_element(By.ID, "api-key")
    field.send_keys(KEY)
    browser.find_element(By.ID, "prompt").click()  # the key is taken on change
    wait(browser, 10).until(
        lambda d: d.execute_script("return document.getElementById('model').value")
    )
    wait(browser, 10).until(lambda d: panel(d)["queue"] == "0 / 0")
    browser.find_element(By.ID, "max-tokens").clear()
    browser.find_element(By.ID, "max-tokens").send_keys("4")
    drop_or_paste(browser, image_file, "paste")
    cached = "#attachments .chip[data-state='cached']"
    wait(browser, 30).until(lambda d: d.find_elements(By.CSS_SELECTOR, cached))  # with the key
    first = send(browser, "Pasted.")
    assert not first["error"], first["text"]
    assert first["sources"] == ["encoder_cache"]
    drop_or_paste(browser, image_file, "drop")  # the same picture again, as a second image
    second = send(browser, "Dropped.")
    assert not second["error"], second["text"]
    assert second["sources"][0] in CACHED and second["sources"][1] in CACHED
    assert browser.save_screenshot(str(ARTIFACTS / "playground-api-key.png"))


def test_a_lost_handle_is_answered_by_sending_the_bytes(browser, open_server, tmp_path) -> None:
    path = tmp_path / "lost.png"
    make_image(11, (90, 70)).save(path)
    open_page(browser, open_server)
    browser.find_element(By.ID, "new-chat").click()
    attach_and_wait_cached(browser, path)
    handles = open_server.engine.engine.handles
    handles.kept._local.clear()  # as if another replica had made it and the store had lost it
    answered = send(browser, "Still there?")
    assert not answered["error"], answered["text"]
    assert answered["sources"] in (["encoder_cache"], ["encoded"])


def test_user_text_is_rendered_as_text_never_html(browser, open_server) -> None:
    open_page(browser, open_server)
    browser.find_element(By.ID, "new-chat").click()
    hostile = '<img src=x onerror="window.pwned=1"><b>bold</b> & <script>window.pwned=2</script>'
    send(browser, hostile)
    user = browser.find_elements(By.CSS_SELECTOR, ".turn.user .text")[-1]
    assert user.get_attribute("textContent") == hostile
    log = browser.find_element(By.ID, "log")
    assert not log.find_elements(By.CSS_SELECTOR, ".text img, .text b, .text script")
    assert browser.execute_script("return window.pwned === undefined")


def test_a_refused_turn_is_shown_and_returned_to_the_composer(browser, open_server) -> None:
    open_page(browser, open_server)
    browser.find_element(By.ID, "new-chat").click()
    browser.find_element(By.ID, "max-tokens").clear()
    browser.find_element(By.ID, "max-tokens").send_keys("0")  # the server answers 400
    refused = send(browser, "Too short a reply.")
    assert refused["error"] and "max_tokens" in refused["text"]
    assert browser.find_element(By.ID, "prompt").get_attribute("value") == "Too short a reply."
    browser.find_element(By.ID, "prompt").clear()
    browser.find_element(By.ID, "max-tokens").clear()
    browser.find_element(By.ID, "max-tokens").send_keys("3")
    answered = send(browser, "Hello")  # the refused turn is not resent
    assert not answered["error"], answered["text"]
    assert answered["stats"]["prompt_tokens"].startswith("prompt ")


def test_a_video_is_encoded_in_pieces_then_cached(browser, video_server, video_file) -> None:
    open_page(browser, video_server)
    browser.find_element(By.ID, "file-input").send_keys(str(video_file))
    chip_video = "return document.querySelector('#attachments .chip video')?.readyState"
    wait(browser, 10).until(lambda d: (d.execute_script(chip_video) or 0) >= 1)  # CSP lets it load
    first = send(browser, "What happens in this video?")
    assert not first["error"], first["text"]
    assert first["sources"] == ["encoded"]
    assert first["media"][0].startswith("video 1: encoded") and "pieces" in first["media"][0]
    assert browser.find_elements(By.CSS_SELECTOR, ".turn.user video.thumb")
    second = send(browser, "And at the end?")
    assert not second["error"], second["text"]
    assert len(second["sources"]) == 1 and second["sources"][0] in CACHED
    assert int(second["stats"]["cached_tokens"].split()[-1]) > 0
    assert browser.save_screenshot(str(ARTIFACTS / "playground-video.png"))


def test_a_broken_video_is_refused_and_returned_to_the_composer(
    browser, video_server, tmp_path
) -> None:
    broken = tmp_path / "broken.mp4"
    broken.write_bytes(b"\x00\x00\x00\x18ftypmp42" + b"not a video" * 100)
    open_page(browser, video_server)
    browser.find_element(By.ID, "new-chat").click()
    browser.find_element(By.ID, "file-input").send_keys(str(broken))
    wait(browser, 10).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#attachments .chip video"))
    refused = send(browser, "What happens?")
    assert refused["error"] and "video" in refused["text"].lower(), refused["text"]
    assert browser.find_elements(By.CSS_SELECTOR, "#attachments .chip video")  # back for a retry
    assert browser.find_element(By.ID, "prompt").get_attribute("value") == "What happens?"
