"""tools: the base URL's user-info sealed (base_url_sealed); base_url keeps it masked

Existing rows are sealed by treg at startup (treg/tool_urls.py seal_legacy): a migration has no key.

Revision ID: 0011
Revises: 0010
"""
from alembic import op
import sqlalchemy as sa

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('tools', sa.Column('base_url_sealed', sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    op.drop_column('tools', 'base_url_sealed')
