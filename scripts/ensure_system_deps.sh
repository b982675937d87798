#!/usr/bin/env bash
# Installs the Debian packages the test suite drives (headless Chromium for the
# HTML-report browser test) when they are missing and we are allowed to.
# Called by `make test` / `make test-all` only: the demo and the library never need a browser.
set -u
if command -v chromium >/dev/null 2>&1; then exit 0; fi
if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "note: chromium not found and cannot apt-get install it; browser tests will be skipped" >&2
  exit 0
fi
echo "make test: installing Debian's chromium (apt-get, about 100 MB) for tests/test_report_browser.py, which opens"
echo "the HTML report in headless Chromium; nothing else needs it (skip with: make test PYTEST_ARGS='-m \"not browser\"')"
(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
  || echo "warning: chromium install failed; browser tests will be skipped" >&2
exit 0
