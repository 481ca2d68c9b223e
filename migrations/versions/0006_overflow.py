"""overflow wired into calls: the org opt-out, the overflow attempt's audit row (its id
``<call_id>:overflow``, tier ``platform-overflow``, ``served_via``)

Revision ID: 0006
Revises: 0005
"""
from alembic import op
import sqlalchemy as sa

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('orgs', sa.Column('platform_overflow', sa.Boolean(), server_default=sa.text('true'),
                                    nullable=False))
    # widening a varchar is a catalog-only change in PostgreSQL (no table rewrite on the hot calls table)
    op.alter_column('calls', 'id', type_=sa.String(length=64), existing_type=sa.String(length=40),
                    existing_nullable=False)
    op.alter_column('calls', 'credential_tier', type_=sa.String(length=32), existing_type=sa.String(length=16),
                    existing_nullable=True)
    op.add_column('calls', sa.Column('served_via', sa.String(length=64), nullable=True))


def downgrade() -> None:
    op.drop_column('calls', 'served_via')
    op.execute("DELETE FROM calls WHERE length(id) > 40 OR length(credential_tier) > 16")
    op.alter_column('calls', 'credential_tier', type_=sa.String(length=16), existing_type=sa.String(length=32),
                    existing_nullable=True)
    op.alter_column('calls', 'id', type_=sa.String(length=40), existing_type=sa.String(length=64),
                    existing_nullable=False)
    op.drop_column('orgs', 'platform_overflow')
