"""provider_resources: the objects each org created on treg's platform vendor accounts (owned resources)

Revision ID: 0008
Revises: 0007
"""
from alembic import op
import sqlalchemy as sa

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('provider_resources',
    sa.Column('provider', sa.String(length=100), nullable=False),
    sa.Column('kind', sa.String(length=64), nullable=False),
    sa.Column('resource_id', sa.String(length=512), nullable=False),
    sa.Column('org_id', sa.String(length=40), nullable=False),
    sa.Column('state', sa.String(length=16), server_default=sa.text("'active'"), nullable=False),
    sa.Column('tag', sa.String(length=200), nullable=True),
    sa.Column('call_id', sa.String(length=200), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("state IN ('active', 'deleted')", name=op.f('ck_provider_resources_state')),
    sa.ForeignKeyConstraint(['org_id'], ['orgs.id'], name=op.f('fk_provider_resources_org_id_orgs'),
                            ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('provider', 'kind', 'resource_id', name=op.f('pk_provider_resources'))
    )
    op.create_index('ix_provider_resources_org_id_created_at', 'provider_resources', ['org_id', 'created_at'],
                    unique=False)


def downgrade() -> None:
    op.drop_index('ix_provider_resources_org_id_created_at', table_name='provider_resources')
    op.drop_table('provider_resources')
