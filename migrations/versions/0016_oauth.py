"""OAuth connections: oauth_apps, oauth_connections, oauth_refreshes; calls: credential_kind, connection_id

An org's OAuth client per provider (its secret sealed), the connections a person granted (tokens sealed,
the consent in flight, the refresh lease) and each refresh's outcome; a call's row names the kind of
credential it injected and the connection (docs/oauth.md).

Revision ID: 0016
Revises: 0015
"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('calls', sa.Column('credential_kind', sa.String(length=16), nullable=True))
    op.add_column('calls', sa.Column('connection_id', sa.String(length=40), nullable=True))
    op.create_table('oauth_apps',
    sa.Column('org_id', sa.String(length=40), nullable=False),
    sa.Column('provider', sa.String(length=64), nullable=False),
    sa.Column('client_id', sa.Text(), nullable=False),
    sa.Column('client_secret_blob', sa.LargeBinary(), nullable=False),
    sa.Column('key_id', sa.String(length=16), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['org_id'], ['orgs.id'], name=op.f('fk_oauth_apps_org_id_orgs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('org_id', 'provider', name=op.f('pk_oauth_apps'))
    )
    op.create_table('oauth_connections',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('org_id', sa.String(length=40), nullable=False),
    sa.Column('provider', sa.String(length=64), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('shared', sa.Boolean(), server_default=sa.text('false'), nullable=False),
    sa.Column('created_by', sa.String(length=40), nullable=True),
    sa.Column('scopes', postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'[]'::jsonb"),
              nullable=False),
    sa.Column('asked_by', sa.String(length=40), nullable=True),
    sa.Column('redirect_after', sa.Text(), nullable=True),
    sa.Column('redirect_uri', sa.Text(), nullable=True),
    sa.Column('link_nonce', sa.String(length=64), nullable=True),
    sa.Column('link_hash', sa.String(length=64), nullable=True),
    sa.Column('link_expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('state_hash', sa.String(length=64), nullable=True),
    sa.Column('state_expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('browser_hash', sa.String(length=64), nullable=True),
    sa.Column('verifier_blob', sa.LargeBinary(), nullable=True),
    sa.Column('tokens_blob', sa.LargeBinary(), nullable=True),
    sa.Column('key_id', sa.String(length=16), nullable=True),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('stale', sa.Boolean(), server_default=sa.text('false'), nullable=False),
    sa.Column('token_version', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('lease_holder', sa.String(length=64), nullable=True),
    sa.Column('lease_until', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('last_refreshed_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('refresh_count', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.CheckConstraint("status IN ('pending', 'active', 'needs_reauth', 'denied')",
                       name=op.f('ck_oauth_connections_status')),
    sa.ForeignKeyConstraint(['org_id'], ['orgs.id'], name=op.f('fk_oauth_connections_org_id_orgs'),
                            ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['created_by'], ['members.id'], name=op.f('fk_oauth_connections_created_by_members'),
                            ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['asked_by'], ['members.id'], name=op.f('fk_oauth_connections_asked_by_members'),
                            ondelete='SET NULL'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_oauth_connections')),
    sa.UniqueConstraint('link_hash', name=op.f('uq_oauth_connections_link_hash')),
    sa.UniqueConstraint('state_hash', name=op.f('uq_oauth_connections_state_hash'))
    )
    op.create_index('ix_oauth_connections_org_id_provider', 'oauth_connections', ['org_id', 'provider'],
                    unique=False)
    op.create_table('oauth_refreshes',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('connection_id', sa.String(length=40), nullable=False),
    sa.Column('org_id', sa.String(length=40), nullable=False),
    sa.Column('at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('outcome', sa.String(length=16), nullable=False),
    sa.CheckConstraint("outcome IN ('ok', 'invalid_grant', 'failed')", name=op.f('ck_oauth_refreshes_outcome')),
    sa.ForeignKeyConstraint(['connection_id'], ['oauth_connections.id'],
                            name=op.f('fk_oauth_refreshes_connection_id_oauth_connections'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_oauth_refreshes'))
    )
    op.create_index('ix_oauth_refreshes_connection_id_at', 'oauth_refreshes', ['connection_id', 'at'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_oauth_refreshes_connection_id_at', table_name='oauth_refreshes')
    op.drop_table('oauth_refreshes')
    op.drop_index('ix_oauth_connections_org_id_provider', table_name='oauth_connections')
    op.drop_table('oauth_connections')
    op.drop_table('oauth_apps')
    op.drop_column('calls', 'connection_id')
    op.drop_column('calls', 'credential_kind')
