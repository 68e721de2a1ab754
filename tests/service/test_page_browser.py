"""The web page in a real browser: Debian's Chromium, headless, driven by selenium,
against ``hypsearch serve`` on loopback. Searches by name (typed, with
autocompletion, and from a shared link) and by picture; checks what is drawn."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.support.server import Server, artifacts, fmnist_test_split, needs_data, write_index

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")

webdriver = pytest.importorskip("selenium.webdriver")
pytestmark = [
    needs_data,
    pytest.mark.skipif(
        not CHROMIUM.exists() or not CHROMEDRIVER.exists(),
        reason="needs Debian's chromium and chromium-driver (apt-get install them)",
    ),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    torch.set_num_threads(1)
    art = artifacts(tmp_path_factory)
    assert art.model_path is not None
    folder = tmp_path_factory.mktemp("page")
    write_index(art, folder / "index", 1000)
    srv = Server(
        ["--model", str(art.model_path), "--index", str(folder / "index")], folder / "server.log"
    )
    try:
        yield srv.wait_ready()
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    profile = tmp_path_factory.mktemp("chromium-profile")
    for arg in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
        "--window-size=1280,1000",
    ):
        opts.add_argument(arg)
    driver = webdriver.Chrome(options=opts, service=Service(executable_path=str(CHROMEDRIVER)))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _wait(driver, predicate, timeout: float = 30):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(lambda d: predicate(d))


def _done(driver):
    return driver.execute_script(
        "const r = document.querySelector('#results');"
        "return r && r.dataset.state === 'done' && !document.querySelector('#answer').hidden;"
    )


def _groups(driver) -> list[dict]:
    return driver.execute_script(
        """return [...document.querySelectorAll('#results .group')].map(g => ({
            level: g.dataset.level,
            title: g.querySelector('h2').textContent,
            ids: [...g.querySelectorAll('.hit')].map(h => h.dataset.id),
            labels: [...g.querySelectorAll('.hit .label')].map(x => x.textContent),
        }));"""
    )


def test_shared_link_runs_a_hierarchical_search(server, browser):
    browser.get(f"{server.url}/?q=sneaker&mode=hierarchical")
    _wait(browser, _done)
    assert browser.find_element("id", "query-label").text == "gym_shoe.n.01"
    groups = _groups(browser)
    assert groups[0]["level"] == "0" and "Same class" in groups[0]["title"]
    assert set(groups[0]["labels"]) == {"gym shoe"} and len(groups[0]["ids"]) == 12  # 12 per level
    assert [g["level"] for g in groups] == sorted((g["level"] for g in groups), key=int)
    assert len(groups) >= 2 and "Siblings" in groups[1]["title"]
    # pictures arrive
    _wait(
        browser,
        lambda d: d.execute_script(
            "const i = document.querySelector('#results .hit img');"
            "return i && i.complete && i.naturalWidth === 28;"
        ),
    )
    # the disk: one query, a dot per result, label prototypes with tree edges
    counts = browser.execute_script(
        "return {q: document.querySelectorAll('#disk .query').length,"
        " r: document.querySelectorAll('#disk .result').length,"
        " l: document.querySelectorAll('#disk .label').length,"
        " e: document.querySelectorAll('#disk .tree line').length,"
        " hits: document.querySelectorAll('#results .hit').length};"
    )
    assert counts["q"] == 1 and counts["r"] == counts["hits"] >= 24
    assert counts["l"] >= 3 and counts["e"] >= 2
    labels = browser.execute_script(
        "return [...document.querySelectorAll('#disk .label text')].map(t => t.textContent)"
    )
    assert "gym shoe" in labels


def test_typed_search_with_autocompletion_and_modes(server, browser):
    from selenium.webdriver.common.by import By

    browser.get(server.url + "/")
    box = browser.find_element(By.ID, "q")
    box.send_keys("sne")
    _wait(
        browser,
        lambda d: any(
            li.text == "sneaker" for li in d.find_elements(By.CSS_SELECTOR, "#suggestions li")
        ),
    )
    next(
        li
        for li in browser.find_elements(By.CSS_SELECTOR, "#suggestions li")
        if li.text == "sneaker"
    ).click()
    _wait(browser, _done)
    # the default ("what it is"): the items the label's cone holds, firmest first
    assert "q=sneaker" in browser.current_url and "mode=auto" in browser.current_url
    groups = _groups(browser)
    assert len(groups) == 1 and groups[0]["level"] == "entailment"
    assert "What it is" in groups[0]["title"] and len(groups[0]["ids"]) == 12
    scores = browser.execute_script(
        "return [...document.querySelectorAll('#results .hit .score')].map(x => x.textContent)"
    )
    pct = [int(t.rstrip("%")) for t in scores]
    assert len(pct) == 12 and all(0 <= p <= 100 for p in pct) and pct == sorted(pct, reverse=True)
    # hierarchical mode: levels, the same class first
    browser.find_element(By.CSS_SELECTOR, 'input[name="mode"][value="hierarchical"]').click()
    _wait(browser, lambda d: _done(d) and _groups(d) and _groups(d)[0]["level"] == "0")
    assert "mode=hierarchical" in browser.current_url
    # nearest mode: one group of the k nearest
    browser.find_element(By.CSS_SELECTOR, 'input[name="mode"][value="nearest"]').click()
    _wait(browser, lambda d: _done(d) and _groups(d) and _groups(d)[0]["level"] == "nearest")
    groups = _groups(browser)
    assert len(groups) == 1 and len(groups[0]["ids"]) == 12
    # an unknown name: the error, with close matches to click
    box.clear()
    box.send_keys("snekaer\n")
    _wait(browser, lambda d: d.find_element(By.ID, "message").is_displayed())
    msg = browser.find_element(By.ID, "message")
    assert "unknown label 'snekaer'" in msg.text
    msg.find_element(By.XPATH, ".//button[text()='sneaker']").click()
    _wait(browser, lambda d: _done(d) and not d.find_element(By.ID, "message").is_displayed())
    assert browser.find_element(By.ID, "query-label").text == "gym_shoe.n.01"


def test_search_by_picture(server, browser, tmp_path):
    from PIL import Image
    from selenium.webdriver.common.by import By

    data = fmnist_test_split()
    row = int(np.flatnonzero(data.targets == 9)[0])  # an ankle boot of the index
    path = tmp_path / "boot.png"
    Image.fromarray(data.images[row]).save(path)
    browser.get(server.url + "/")
    browser.find_element(By.CSS_SELECTOR, 'input[name="mode"][value="nearest"]').click()
    browser.find_element(By.ID, "file").send_keys(str(path))
    _wait(browser, lambda d: _done(d) and d.find_elements(By.CSS_SELECTOR, "#results .hit"))
    assert browser.find_element(By.ID, "query-picture").is_displayed()
    groups = _groups(browser)
    assert groups[0]["level"] == "nearest"
    assert groups[0]["ids"][0] == f"fashion-mnist-test-{row}"  # the picture finds itself
    qlabel = browser.find_element(By.ID, "query-label").text
    assert qlabel.endswith(".n.01")
    assert browser.execute_script("return document.querySelectorAll('#disk .query').length") == 1
    # the same picture, hierarchical: grouped by level from the predicted label
    browser.find_element(By.CSS_SELECTOR, 'input[name="mode"][value="hierarchical"]').click()
    _wait(browser, lambda d: _done(d) and _groups(d) and _groups(d)[0]["level"] == "0")
    groups = _groups(browser)
    assert [g["level"] for g in groups] == sorted((g["level"] for g in groups), key=int)
    assert browser.find_element(By.ID, "query-label").text == qlabel
