"""The chat page `tessera serve` serves at /, driven in headless Chromium (selenium with
Debian's chromium and chromium-driver): it loads and shows the composition, sends a message
and receives the streamed reply with its speed, keeps the conversation for a second turn,
and shows the server's error for a bad API key. Also, without a browser: the page's headers,
/props behind the key, --no-chat-page, and which origins may call."""
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from server_util import Server, case, finish  # noqa: E402

TESSERA, SOURCE, MODEL = sys.argv[1:4]
KEY = "page-test-key"


def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--no-proxy-server"):
        opts.add_argument(a)
    driver = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    return webdriver.Chrome(service=Service(executable_path=driver), options=opts)


def wait_for(drv, fn, timeout=60):
    from selenium.webdriver.support.ui import WebDriverWait
    return WebDriverWait(drv, timeout).until(lambda d: fn(d))


def send(drv, text):
    from selenium.webdriver.common.by import By
    drv.find_element(By.ID, "input").send_keys(text)
    drv.find_element(By.ID, "send").click()


with Server(TESSERA, MODEL, ["--api-key", KEY, "--set", "sampling.max_tokens=12"],
            label="page") as srv:
    base = f"http://127.0.0.1:{srv.port}"

    @case
    def test_page_is_served_with_its_headers():
        status, headers, body = srv.request("GET", "/")
        assert status == 200 and headers["content-type"].startswith("text/html")
        assert "frame-ancestors 'none'" in headers["content-security-policy"]
        assert b"/v1/chat/completions" in body and b"<script" in body
        assert b"src=\"http" not in body  # self-contained: nothing from elsewhere

    @case
    def test_props_needs_the_key_and_names_the_composition():
        assert srv.request("GET", "/props")[0] == 401
        p = srv.ok("GET", "/props", headers={"Authorization": f"Bearer {KEY}"})
        assert p["slots"] >= 1 and p["slot_context"] > 0 and "composition" in p["composition"]

    @case
    def test_own_origin_may_call_a_foreign_one_may_not():
        h = {"Authorization": f"Bearer {KEY}", "Origin": base, "Host": f"127.0.0.1:{srv.port}"}
        assert srv.request("GET", "/props", headers=h)[0] == 200
        p = srv.port
        for host in (f"localhost:{p}", f"[::1]:{p}"):  # addresses and localhost pass
            status = srv.request("GET", "/props", headers=dict(h, Origin=f"http://{host}",
                                                                Host=host))[0]
            assert status == 200, (host, status)
        refused = [("http://evil.example", f"127.0.0.1:{p}"),
                   (f"https://127.0.0.1:{p}", f"127.0.0.1:{p}")]
        # names that a DNS rebinding attacker controls, however much they look local
        for host in (f"rebound.example:{p}", f"127.0.0.1.evil.example:{p}",
                     f"localhost.evil.example:{p}", f"1.2.3:{p}", f"1.2.3.4.5:{p}",
                     f"[::1]evil:{p}", f"[]:{p}", "", f"0x7f.0.0.1:{p}"):
            refused.append((f"http://{host}", host))
        for origin, host in refused:
            status = srv.request("GET", "/props", headers=dict(h, Origin=origin, Host=host))[0]
            assert status in (400, 403), (origin, host, status)

    drv = browser()
    try:
        from selenium.webdriver.common.by import By

        @case
        def test_browser_chats_with_streamed_replies():
            drv.get(base + "/")
            drv.find_element(By.ID, "api-key").send_keys(KEY)
            drv.execute_script("loadProps()")
            wait_for(drv, lambda d: "composition" in
                     d.find_element(By.ID, "composition").get_attribute("textContent"))
            assert "slots" in drv.find_element(By.ID, "model").text
            send(drv, "Hello")
            done = wait_for(drv, lambda d: d.find_elements(By.CSS_SELECTOR, ".assistant.done"))
            reply = done[0].text
            assert "tok/s" in reply and "12 tokens" in reply, reply
            assert len(reply.split("12 tokens")[0].strip()) > 0, reply  # text came before it
            send(drv, "And then?")
            wait_for(drv, lambda d: len(d.find_elements(By.CSS_SELECTOR, ".assistant.done")) == 2)
            sent = drv.execute_script("return JSON.stringify(messages)")
            roles = [m["role"] for m in json.loads(sent)]
            assert roles == ["user", "assistant", "user", "assistant"], roles
            assert drv.find_element(By.ID, "error").text == ""

        @case
        def test_markup_in_a_message_stays_text():
            # what a user types, and what a model writes back, is shown as text, never parsed
            drv.get(base + "/")
            drv.find_element(By.ID, "api-key").send_keys(KEY)
            attack = '<img src=x onerror="window.pwned=1"><b>bold</b>'
            send(drv, attack)
            wait_for(drv, lambda d: d.find_elements(By.CSS_SELECTOR, ".assistant.done"))
            log = drv.find_element(By.ID, "log")
            assert attack in log.text, log.text
            assert not log.find_elements(By.TAG_NAME, "img")
            assert not log.find_elements(By.TAG_NAME, "b")
            assert drv.execute_script("return window.pwned === undefined")
            # a reply is appended as text too: the page never assigns innerHTML
            page = srv.request("GET", "/")[2]
            assert b"innerHTML" not in page and b"insertAdjacentHTML" not in page

        @case
        def test_browser_shows_an_error_for_a_bad_key():
            drv.get(base + "/")
            drv.find_element(By.ID, "api-key").send_keys("wrong")
            send(drv, "Hello")
            err = wait_for(drv, lambda d: d.find_element(By.ID, "error").text)
            assert "API key" in err, err
            assert not drv.find_elements(By.CSS_SELECTOR, ".assistant")
    finally:
        drv.quit()

with Server(TESSERA, MODEL, ["--no-chat-page"], label="nopage") as srv:
    @case
    def test_no_chat_page_turns_it_off():
        status, _, body = srv.request("GET", "/")
        assert status == 404 and b"--no-chat-page" in body
        own = f"http://127.0.0.1:{srv.port}"
        assert srv.request("GET", "/v1/models", headers={"Origin": own})[0] == 403

finish()
