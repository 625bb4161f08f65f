"""Template helpers of the model catalogue pages."""

from __future__ import annotations

from django import template

from console.model_list import query_string

register = template.Library()


@register.simple_tag
def page_query(options: dict, page: int) -> str:
    """The Models page's query string for another page of the same search."""
    return query_string(options, page=page)
