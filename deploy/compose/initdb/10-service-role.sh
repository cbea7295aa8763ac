#!/usr/bin/env bash
# Run once by the postgres image on an empty data directory: the role the API and the workers
# connect as. `memstore migrate` (as the owner, POSTGRES_USER) grants it what it may do; row-level
# security confines it to the tenants it is set to. On a data directory made before this script
# existed, the migration creates the role without a password: set one with
#   ALTER ROLE memstore_service PASSWORD '...';
set -euo pipefail
psql -v ON_ERROR_STOP=1 -v password="$MEMSTORE_SERVICE_PASSWORD" \
    --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" <<'SQL'
CREATE ROLE memstore_service LOGIN PASSWORD :'password';
SQL
