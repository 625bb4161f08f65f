"""``/api/schema/``: the OpenAPI document, built once per process.

The document depends only on the code (``SERVE_PUBLIC``: every endpoint, whoever asks),
yet drf-spectacular builds it anew for each request: about 85 ms of the console's CPU a
call, which any signed-in user could repeat at will. It is kept per language (a few at
most), and ``?version=`` is not read: the API has one version, and any string there
named another document to build and keep ("1.0.0 (evil)").
"""

from __future__ import annotations

from collections import OrderedDict

from django.utils import translation
from drf_spectacular.views import SpectacularAPIView
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response

KEPT_SCHEMAS = 8


class SchemaView(SpectacularAPIView):
    _built: OrderedDict[tuple, dict] = OrderedDict()

    def _get_version_parameter(self, request):
        return None

    def finalize_response(self, request, response, *args, **kwargs):
        if isinstance(response, Response) and response.status_code >= 400:
            # An error is {"error": ...} here as everywhere: the schema's own renderers
            # wrote a 401 as "Error: Authentication credentials ..." in YAML.
            request.accepted_renderer, request.accepted_media_type = JSONRenderer(), JSONRenderer.media_type
        return super().finalize_response(request, response, *args, **kwargs)

    def _get_schema_response(self, request):
        version = self.api_version or request.version
        key = (version, translation.get_language())
        schema = self._built.get(key)
        if schema is None:
            generator = self.generator_class(urlconf=self.urlconf, api_version=version, patterns=self.patterns)
            schema = generator.get_schema(request=request, public=self.serve_public)
            self._built[key] = schema
            while len(self._built) > KEPT_SCHEMAS:
                self._built.popitem(last=False)
        return Response(data=schema, headers={"Content-Disposition": f'inline; filename="{self._get_filename(request, version)}"'})
