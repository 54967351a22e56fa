/* Ballast's pages on any screen (no framework; the network is closed).
 * - Every table with a header row reads as one card per row on a narrow
 *   screen (static/ballast.css "table.stack"): each cell is labelled with its
 *   column's heading, also in rows htmx swaps in later.
 * - On a narrow screen the header's links fold behind a Menu button. */
(function () {
  function label(root) {
    root.querySelectorAll('main table').forEach(function (table) {
      var heads = table.querySelectorAll('thead th');
      if (!heads.length) return;
      table.classList.add('stack');
      var names = Array.prototype.map.call(heads, function (th) {
        return th.textContent.trim();
      });
      table.querySelectorAll('tbody tr').forEach(function (row) {
        var col = 0;
        Array.prototype.forEach.call(row.cells, function (cell) {
          if (!cell.hasAttribute('data-label') && cell.colSpan === 1) {
            cell.setAttribute('data-label', names[col] || '');
          }
          col += cell.colSpan;
        });
      });
    });
  }
  function menu() {
    var header = document.querySelector('header.top');
    var button = header && header.querySelector('button.menu');
    if (!button) return;
    button.addEventListener('click', function () {
      var open = header.classList.toggle('open');
      button.setAttribute('aria-expanded', open ? 'true' : 'false');
    });
  }
  document.addEventListener('DOMContentLoaded', function () {
    label(document);
    menu();
  });
  document.addEventListener('htmx:afterSwap', function () { label(document); });
})();
