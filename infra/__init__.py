"""What the AWS stack needs besides its code: the tables and bucket built from
``template.yaml`` (:mod:`.tables`), the OpenAPI document, and the template itself.

Installed as ``dreamlake.lakeshore.infra`` so that ``lakeshore dev`` works from an
installed package: ``template.yaml`` here is a link to the repository's one template,
which the wheel carries as a file (one source, no copy that could drift).
"""
