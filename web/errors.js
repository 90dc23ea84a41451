// Counts the page's errors into <body data-errors="N"> (and the last one into data-last-error),
// so that a headless browser's --dump-dom shows whether the page ran cleanly. Loaded first, in
// <head>, so it sees errors in every script after it; it must not depend on anything.
(function () {
  'use strict';
  let count = 0;
  let last = '';

  function publish() {
    if (!document.body) return;  // still in <head>; DOMContentLoaded publishes
    document.body.setAttribute('data-errors', String(count));
    if (last) document.body.setAttribute('data-last-error', last.slice(0, 300));
  }

  function record(message) {
    count += 1;
    last = String(message);
    publish();
  }

  // Uncaught exceptions in scripts.
  window.onerror = function (message, source, line) {
    record(message + (source ? ' (' + source + ':' + line + ')' : ''));
  };
  // A script or stylesheet that failed to load fires 'error' on its element, not window.onerror;
  // only a capturing listener on window sees it.
  window.addEventListener('error', function (event) {
    const target = event.target;
    if (target && target !== window && (target.src || target.href)) {
      record('failed to load ' + (target.src || target.href));
    }
  }, true);
  window.addEventListener('unhandledrejection', function (event) {
    const reason = event.reason;
    record('unhandled rejection: ' + (reason && reason.message ? reason.message : reason));
  });
  // Errors the page reports itself (and any library's) go through console.error.
  const originalError = console.error.bind(console);
  console.error = function () {
    record(Array.prototype.map.call(arguments, String).join(' '));
    originalError.apply(null, arguments);
  };

  document.addEventListener('DOMContentLoaded', publish);
})();
