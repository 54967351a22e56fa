"""Template filters for money: nano-USD integers shown as USD decimal strings."""

from django import template

from billing.money import nano_to_usd_str

register = template.Library()


@register.filter
def nano_usd(value) -> str:
    """Format an integer nano-USD amount as ``$0.0000012`` (``-$…`` when negative)."""
    if value is None or value == "":
        return ""
    nano = int(value)
    sign = "-" if nano < 0 else ""
    return f"{sign}${nano_to_usd_str(abs(nano))}"
