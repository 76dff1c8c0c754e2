"""The web console in a real browser: Debian's chromium, headless, driven by selenium, against a
real cluster and a `roq-web` process with auth on (tests/web/conftest.py).

A client logs in and is refused an admin action, with the refusal on the page; an admin creates a
queue through the form, sees load published over the HTTP API move its live rate, opens the queue
page, sees its exchanges, peeks at a published message (shown as text, not markup), publishes from
the page and deletes the queue after confirming. Screenshots of both pages are saved under the
test's tmp path, and copied to docs/images/ only with SAVE_CONSOLE_SCREENSHOTS=1.
Without chromium or chromedriver the tests skip locally and fail in CI (tests/conftest.py).
"""

from __future__ import annotations

import io
import json
import math
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from PIL import Image

from roq.client import Subscriber
from tests.conftest import failed, unavailable
from tests.support.helpers import record_figures
from tests.web.conftest import WebCluster

try:
    from selenium import webdriver
    from selenium.common.exceptions import (
        NoSuchElementException,
        StaleElementReferenceException,
        TimeoutException,
    )
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.chrome.webdriver import WebDriver
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webelement import WebElement
    from selenium.webdriver.support.ui import WebDriverWait
    HAVE_SELENIUM = True
except ImportError:  # the dev extra brings it; without it the fixture below says what is missing
    HAVE_SELENIUM = False

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

T = TypeVar("T")
WAIT_SECONDS = 20.0  # the longest anything may take to show on the page (it polls every 2 s)
WINDOW = (1400, 1000)
DOCS_IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"
# Read once and taken out of the environment: the daemons this session starts inherit it, and they
# take every ROQ_* variable as configuration and refuse one they do not know.
SAVE_TO_DOCS = os.environ.get("SAVE_CONSOLE_SCREENSHOTS", "") == "1"
# A payload that would run script if the page put it in as HTML; it must show as text.
HOSTILE = "<img src=x onerror=window.pwned=1><b>bold</b>"


# ------------------------------------------------------------------ the browser

def find_browser() -> tuple[str, str]:
    if not HAVE_SELENIUM:
        unavailable("selenium is not installed (pip install -e '.[dev]')", "the console browser test")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not chromium or not driver:
        unavailable("chromium and chromedriver are not on PATH (Debian: apt-get install chromium chromium-driver; "
                    "scripts/setup.sh dev,spark installs them)", "the console browser test")
    return chromium, driver


@pytest.fixture(scope="module", autouse=True)
def browser_binaries() -> tuple[str, str]:
    """Chromium and chromedriver, looked for before the module's cluster starts."""
    return find_browser()


@pytest.fixture
def browser(browser_binaries: tuple[str, str], tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[WebDriver]:
    chromium, chromedriver = browser_binaries
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", f"--window-size={WINDOW[0]},{WINDOW[1]}", "--disable-gpu",
                     "--disable-dev-shm-usage", "--lang=en-GB"):
        options.add_argument(argument)
    if os.geteuid() == 0:  # chromium refuses to run its sandbox as root
        options.add_argument("--no-sandbox")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(chromedriver, log_output=str(tmp_path / "chromedriver.log")),
                              options=options)
    try:
        driver.set_page_load_timeout(30)
        yield driver
        assert not script_errors(driver), "the page logged script errors"
    finally:
        if failed(request):
            print(f"----- page at {driver.current_url} -----\n{driver.page_source[:4000]}")
        driver.quit()


def script_errors(driver: WebDriver) -> list[str]:
    """Script errors and Content-Security-Policy violations the page logged (not the API's own
    4xx answers, which Chrome logs as failed resources and the page shows on purpose)."""
    errors = [entry["message"] for entry in driver.get_log("browser")
              if entry["level"] == "SEVERE" and "Failed to load resource" not in entry["message"]]
    for error in errors:
        print(f"browser console: {error}")
    return errors


class Console:
    """The console in the browser, found by its data-testid attributes."""

    def __init__(self, driver: WebDriver, web: WebCluster, shots: Path) -> None:
        self.driver, self.web, self.shots = driver, web, shots

    def open(self, path: str = "/") -> None:
        self.driver.get(self.web.url + path)

    def find(self, testid: str) -> WebElement:
        return self.driver.find_element(By.CSS_SELECTOR, f'[data-testid="{testid}"]')

    def all(self, css: str) -> list[WebElement]:
        return self.driver.find_elements(By.CSS_SELECTOR, css)

    def wait(self, condition: Callable[[], T], what: str) -> T:
        """The first truthy value of `condition`, polled until WAIT_SECONDS pass (the page
        rebuilds parts of itself as it polls: a vanished element is retried, not an error)."""
        wait = WebDriverWait(self.driver, WAIT_SECONDS, poll_frequency=0.1,
                             ignored_exceptions=(NoSuchElementException, StaleElementReferenceException))
        try:
            return wait.until(lambda _driver: condition())
        except TimeoutException:
            raise AssertionError(f"waited {WAIT_SECONDS:g} s for {what}; "
                                 f"the page's message: {self.message_text()!r}") from None

    def first_text(self, css: str) -> str:
        found = self.all(css)
        return found[0].text if found else ""

    def shown(self, testid: str) -> bool:
        return self.find(testid).is_displayed()

    def message_text(self) -> str:
        try:
            box = self.find("message")
            return box.text if box.is_displayed() else ""
        except (NoSuchElementException, StaleElementReferenceException):
            return ""

    def message(self, kind: str, containing: str) -> str:
        """Wait for #message to be of `kind` (ok, info, error) and hold `containing`."""
        def found() -> str:
            box = self.find("message")
            shown = box.is_displayed() and box.get_attribute("data-kind") == kind
            return box.text if shown and containing in box.text else ""
        return self.wait(found, f"a message ({kind}) with {containing!r}")

    def click(self, testid: str) -> None:
        """Click after centring the element: the sticky top bar may cover one at the window's top."""
        element = self.find(testid)
        self.driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", element)
        element.click()

    def type(self, testid: str, text: str) -> None:
        field = self.find(testid)
        field.clear()
        field.send_keys(text)

    def login(self, token: str, role: str) -> None:
        self.wait(lambda: self.shown("login-token"), "the login form")
        self.type("login-token", token)
        self.click("login-submit")
        self.wait(lambda: self.find("session-role").text == role, f"logged in as {role}")

    def rate(self, testid: str) -> float:
        return float(self.find(testid).text.replace(",", ""))

    def overlaps(self, css: str, other_css: str) -> bool:
        """Whether the first elements matching the two selectors overlap on the screen."""
        return bool(self.driver.execute_script(
            "const [a, b] = [document.querySelector(arguments[0]), document.querySelector(arguments[1])]"
            ".map((e) => e.getBoundingClientRect());"
            "return a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;", css, other_css))

    def screenshot(self, name: str) -> Path:
        """The whole page (the window grows to its height for the shot), without the message line
        over it, under the test's tmp path; also in docs/images/ with SAVE_CONSOLE_SCREENSHOTS=1."""
        if self.message_text():
            self.driver.find_element(By.CSS_SELECTOR, '[data-testid="message"] .close').click()
        height = self.driver.execute_script("return document.documentElement.scrollHeight")
        self.driver.set_window_size(WINDOW[0], max(WINDOW[1], height + 140))  # + the window's frame
        path = self.shots / f"{name}.png"
        try:
            assert self.driver.save_screenshot(str(path)), f"no screenshot {path}"
        finally:
            self.driver.set_window_size(*WINDOW)
        if SAVE_TO_DOCS:
            DOCS_IMAGES.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, DOCS_IMAGES / path.name)
            print(f"screenshot copied to {DOCS_IMAGES / path.name}")
        return path


@pytest.fixture
def console(browser: WebDriver, web_cluster: WebCluster, tmp_path: Path) -> Console:
    shots = tmp_path / "screenshots"
    shots.mkdir()
    return Console(browser, web_cluster, shots)


# ------------------------------------------------------------------ load over the HTTP API

class Load:
    """Publishes batches of JSON lines over the HTTP API from a thread until stopped, in a wave of
    about 300 to 1,700 msg/s (so the charts show a shape); remembers what it sent and any failure."""

    PAUSE = 0.1  # seconds between batches: pacing, not waiting for anything

    def __init__(self, web: WebCluster, queue: str, topic: str) -> None:
        self.web, self.queue, self.topic = web, queue, topic
        self.sent = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="http-load", daemon=True)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *_exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        with httpx.Client(base_url=self.web.url, headers=self.web.headers(self.web.client_token), timeout=30) as http:
            started = time.monotonic()
            while not self._stop.is_set():
                batch = int(100 + 70 * math.sin((time.monotonic() - started) * 1.2))
                lines = [json.dumps({"order": self.sent + i, "note": HOSTILE}) for i in range(batch)]
                answer = http.post(f"/api/queues/{self.queue}/messages", params={"topic": self.topic, "split": "lines"},
                                   content="\n".join(lines).encode())
                if answer.status_code != 200:
                    self.errors.append(f"{answer.status_code} {answer.text}")
                    return
                self.sent += answer.json()["count"]
                self._stop.wait(self.PAUSE)


def both_lines_visible(png: bytes) -> bool:
    """In a screenshot of the rate chart, the "in" colour (blue) shows in nearly every pixel column
    that the "out" line (green) crosses: the two stay visible where the rates are the same."""
    image = Image.open(io.BytesIO(png)).convert("RGB")
    width, height = image.size
    pixels = image.load()
    blue_columns, green_columns = set(), set()
    for x in range(width):
        for y in range(height):
            r, g, b = pixels[x, y]
            if b > r + 60 and b > g + 30:
                blue_columns.add(x)
            elif g > r + 60 and g > b + 20:
                green_columns.add(x)
    return len(green_columns) > width // 4 and len(green_columns & blue_columns) >= 0.95 * len(green_columns)


def queues_seen_by_admin(web: WebCluster) -> list[str]:
    answer = httpx.get(web.url + "/api/queues", headers=web.headers(web.admin_token), timeout=30)
    answer.raise_for_status()
    return [q["name"] for q in answer.json()]


def busy_samples(web: WebCluster, queue: str) -> int:
    """How many of the gateway's history samples of `queue` saw messages come in."""
    answer = httpx.get(web.url + "/api/history", params={"seconds": 60}, headers=web.headers(), timeout=30)
    return sum(1 for rate in answer.json()["queues"].get(queue, {}).get("in", []) if rate > 0)


# ------------------------------------------------------------------ the tests

def test_a_client_is_refused_admin_actions_and_the_page_says_why(console: Console, web_cluster: WebCluster) -> None:
    web = web_cluster
    console.open("/")
    console.wait(lambda: console.shown("login-panel"), "the login form, as auth is on")
    assert not console.find("create-queue-form").is_displayed()

    console.login(web.client_token, "client")
    assert console.find("session-user").text == "app"
    console.message("ok", "Logged in as app")
    assert not console.overlaps('[data-testid="message"]', ".page-head h1")  # the toast leaves the title be
    console.wait(lambda: console.find("leader").text not in ("", "–"), "the leader on the overview")
    kept = console.driver.execute_script(
        "return JSON.stringify(localStorage) + JSON.stringify(sessionStorage) + document.cookie")
    assert web.client_token not in kept and web.client_token not in console.driver.page_source
    assert "roq_session" not in kept  # the session cookie is HttpOnly

    console.type("create-name", "made-by-client")
    console.click("create-submit")
    refusal = console.message("error", "admin role")
    assert refusal.startswith("Refused (create queue made-by-client)"), refusal
    assert "made-by-client" not in queues_seen_by_admin(web)

    console.click("logout")
    console.wait(lambda: console.shown("login-panel"), "the login form after logging out")
    console.message("info", "Logged out")
    assert console.find("session-user").text == "not logged in"


def test_an_admin_creates_a_queue_and_watches_it_live(console: Console, web_cluster: WebCluster) -> None:
    web, queue = web_cluster, "web-orders"
    console.open("/")
    console.login(web.admin_token, "admin")
    console.type("create-name", queue)
    console.type("create-exchanges", "2")
    console.click("create-submit")
    console.message("ok", f"Queue {queue} created with 2 exchanges")
    console.wait(lambda: console.find(f"exchanges-{queue}").text == "2/2", "both exchanges running")

    def placed_on() -> set[str]:
        return {console.find(f"placement-host-{queue}-{x}").text for x in ("x1", "x2")}
    console.wait(lambda: placed_on() == {"host-1", "host-2"}, "the overview showing where its exchanges run")

    with Load(web, queue, "eu.orders") as load:
        console.wait(lambda: console.rate(f"rate-in-{queue}") > 0, "the queue's msg/s in above 0 on the overview")
        console.wait(lambda: busy_samples(web, queue) >= 16, "some seconds of traffic in the history")
        console.wait(lambda: console.rate(f"rate-in-{queue}") > 0, "the rate still above 0")
        overview = console.screenshot("console-overview")

        console.click(f"queue-link-{queue}")
        console.wait(lambda: console.find("queue-name").text == queue, "the queue page")
        console.wait(lambda: all(console.find(f"exchange-state-{x}").text == "running" for x in ("x1", "x2")),
                     "both exchanges running on the queue page")
        assert {console.find(f"exchange-host-{x}").text for x in ("x1", "x2")} <= {"host-1", "host-2"}
        console.wait(lambda: console.rate(f"rate-in-{queue}") > 0, "the queue page's msg/s in above 0")
        console.wait(lambda: both_lines_visible(console.find("rate-chart").screenshot_as_png),
                     "the in and out lines both visible where the rates are the same")

        console.type("peek-topic", "eu.orders")
        console.click("peek-submit")
        payload = console.wait(lambda: console.first_text('[data-testid="peek-results"] tr[data-key] td.payload'),
                               "a peeked message")
        assert HOSTILE in payload and json.loads(payload)["note"] == HOSTILE  # shown as text...
        assert not console.all('[data-testid="peek-results"] img, [data-testid="peek-results"] b')  # ...not markup
        assert console.driver.execute_script("return window.pwned === undefined")
        seqs = [int(cell.text.replace(",", ""))
                for cell in console.all('[data-testid="peek-results"] tr[data-key] td:first-child')]
        assert len(seqs) > 1 and seqs == sorted(seqs), seqs  # oldest first, as the API answers
        assert "oldest first" in console.find("peek-summary").text

        console.type("rule-max_rate", "-5")
        console.click("rules-save")
        rejected = console.message("error", "--max-rate")
        assert rejected.startswith(f"Rejected (save the rules of {queue})"), rejected
        console.type("rule-max_rate", "50000")
        console.click("rules-save")
        console.message("ok", "max_rate = 50000")
        console.wait(lambda: console.find("queue-scaling").text.startswith("autoscaling"), "the rules' badge")

        console.type("publish-topic", "eu.page")
        console.type("publish-text", "hello from the page")
        console.click("publish-submit")
        console.message("ok", "Published 1 message")
        console.type("peek-topic", "eu.page")
        console.click("peek-submit")
        console.wait(lambda: "hello from the page" in console.find("peek-results").text, "the page's message peeked")
        queue_page = console.screenshot("console-queue")
    assert load.sent > 0 and not load.errors, load.errors
    record_figures("console screenshots", overview=str(overview), queue=str(queue_page))

    console.click("delete-queue")
    console.wait(lambda: console.shown("confirm-dialog"), "the confirmation dialog")
    console.click("confirm-ok")
    console.message("ok", f"Queue {queue} deleted")
    console.wait(lambda: not console.all(f'[data-testid="queue-row-{queue}"]'), "the queue gone from the overview")
    assert queue not in queues_seen_by_admin(web)


def test_an_admin_grants_a_permission_in_the_console_and_sees_it_listed(console: Console,
                                                                       web_cluster: WebCluster) -> None:
    web = web_cluster
    console.open("/")
    console.login(web.client_token, "client")
    console.wait(lambda: console.find("leader").text not in ("", "–"), "the overview")
    assert not console.shown("permissions-panel")  # who may do what is for admins
    console.click("logout")

    console.login(web.admin_token, "admin")
    console.wait(lambda: console.shown("permissions-panel"), "the permissions panel")
    console.wait(lambda: "not enforced" in console.find("permissions-default").text,
                 "the panel saying this cluster runs without CURVE")
    console.type("perm-name", "app")
    console.type("perm-pattern", "web-*")
    console.click("perm-grant")
    console.message("ok", "Granted publish web-*: key app now has publish web-*")
    console.wait(lambda: console.find("permission-publish-app").text == "web-*", "the grant listed")
    console.type("perm-pattern", "")
    console.click("perm-revoke")
    console.message("error", "name the queues")  # an empty pattern would mean every right: never sent
    stored = httpx.get(web.url + "/api/permissions/app", headers=web.headers(web.admin_token), timeout=30).json()
    assert stored["entry"] == {"publish": ["web-*"], "subscribe": [], "consume": [], "admin": False}

    console.click("permission-reset-app")
    console.wait(lambda: console.shown("confirm-dialog"), "the confirmation dialog")
    console.click("confirm-ok")
    console.message("ok", "Key app has no entry now")
    console.wait(lambda: not console.all('[data-testid="permission-row-app"]'), "the entry gone from the list")


def make_group_backlog(web: WebCluster, queue: str) -> Subscriber:
    """Queue `queue` with group "workers": a member (returned) holding 5 messages unacked, 45 ready."""
    made = httpx.post(web.url + "/api/queues", json={"name": queue}, headers=web.headers(web.admin_token), timeout=30)
    assert made.status_code == 201, made.text
    member = Subscriber(queue, web.config, ["jobs"], group="workers", prefetch=5, auto_ack=False)
    sent = httpx.post(web.url + f"/api/queues/{queue}/messages", params={"topic": "jobs", "split": "lines"},
                      content="\n".join(f"job {i}" for i in range(50)).encode(), headers=web.headers(), timeout=30)
    assert sent.status_code == 200, sent.text
    return member


def click_and_confirm(console: Console, testid: str) -> None:
    console.click(testid)
    console.wait(lambda: console.shown("confirm-dialog"), f"the confirmation dialog of {testid}")
    console.click("confirm-ok")


def test_the_queue_page_shows_its_consumer_groups_and_an_admin_resets_purges_and_deletes_it_once_empty(
        console: Console, web_cluster: WebCluster) -> None:
    web, queue = web_cluster, "web-jobs"
    member = make_group_backlog(web, queue)
    try:
        console.open(f"/queues/{queue}")
        console.login(web.client_token, "client")

        def group_figures() -> tuple[str, ...]:
            return tuple(console.find(f"group-{key}-workers").text for key in ("members", "in_flight", "ready"))
        console.wait(lambda: group_figures() == ("1", "5", "45"), "the group's figures, live")
        assert "jobs" in console.find("group-row-workers").text
        for admin_only in ("group-reset-workers", "group-delete-workers", "purge-queue", "delete-if-empty"):
            assert not console.shown(admin_only), f"{admin_only} shown to a client"
        console.click("logout")

        console.login(web.admin_token, "admin")
        console.wait(lambda: console.shown("group-reset-workers"), "the group's buttons, for an admin")
        shot = console.screenshot("console-groups")
        click_and_confirm(console, "group-reset-workers")
        console.message("ok", "Group workers reset: 45 messages dropped.")
        console.wait(lambda: group_figures() == ("1", "5", "0"), "the reset's effect: the member keeps its 5")

        click_and_confirm(console, "delete-if-empty")
        refusal = console.message("error", "is not empty")
        assert refusal.startswith(f"Conflict (delete queue {queue} if empty)"), refusal
        assert queue in queues_seen_by_admin(web)

        member.close()  # its 5 go back to ready
        console.wait(lambda: group_figures() == ("0", "0", "5"), "the member gone")
        click_and_confirm(console, "purge-queue")
        console.message("ok", f"Queue {queue} purged: 50 retained messages and 5 group messages dropped.")
        console.wait(lambda: group_figures() == ("0", "0", "0"), "the purge's effect")

        click_and_confirm(console, "delete-if-empty")
        console.message("ok", f"Queue {queue} deleted")  # on the overview
        assert queue not in queues_seen_by_admin(web)
    finally:
        member.close()
        httpx.delete(web.url + f"/api/queues/{queue}", headers=web.headers(web.admin_token), timeout=30)
    record_figures("console screenshot of the consumer groups", queue=str(shot))


def test_the_http_api_reference_renders_every_operation(console: Console, web_cluster: WebCluster) -> None:
    """/docs (the console's "HTTP API" tab) renders the OpenAPI 3.1 document FastAPI writes, served
    under the console's Content-Security-Policy (the browser fixture fails on any violation)."""
    schema = httpx.get(web_cluster.url + "/openapi.json", timeout=30).json()
    assert schema["openapi"].startswith("3.1")
    operations = {(method.upper(), path) for path, ops in schema["paths"].items() for method in ops}
    assert ("POST", "/api/queues/{queue}/messages") in operations

    console.open("/docs")
    console.wait(lambda: len(console.all(".opblock")) == len(operations), f"the {len(operations)} operations listed")
    shown = {(block.find_element(By.CSS_SELECTOR, ".opblock-summary-method").text,
              block.find_element(By.CSS_SELECTOR, ".opblock-summary-path").get_attribute("data-path"))
             for block in console.all(".opblock")}
    assert shown == operations
    tags = {tag.get_attribute("data-tag") for tag in console.all(".opblock-tag")}
    assert {"session", "cluster", "queues", "admin", "permissions", "data"} <= tags
    page = console.find("swagger-ui").text
    assert "Unable to render" not in page and "RoQ HTTP API" in page
